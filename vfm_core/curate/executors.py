"""Executors run a list of `Stage`s over input items and stream the final items back.

- `LocalExecutor` (default): in-process, deepest work first (a video's clips are finished before
  another video's work is taken up where both wait, so the resumable pipeline checkpoints early
  and memory stays flat), on `workers` threads (default: the usable CPUs). The heavy work (PyAV's
  decode and encode, numpy) runs outside the interpreter lock, so the clips of one video are
  transcoded side by side and a 2-core machine is used whole (`benchmarks/real_cuts.py`).
- `RayExecutor`: Ray Data streaming execution of the same stage objects, one autoscaled actor
  pool per stage (`ActorPoolStrategy(min_size=1, max_size=max_workers)`): Ray grows the pool of
  a stage whose actors have queued tasks, so slow stages (transcode) get more workers than fast
  ones (probe) -- the paper's auto-balancing. Each actor reserves `cpus_per_worker`, by default
  sized so that one pool can reach `max_workers` while the others hold one actor. With
  `pool_size=n` every stage gets a fixed pool of n actors instead (the equal-pools peer of
  `benchmarks/autobalance.py`). With `record_events` every actor reports its setup and batches
  (`vfm_core.curate.balance`) and `events` holds them after the run. Each actor calls
  `stage.setup()` once. Every item is its own block, so the clips of one video fan out over the
  whole transcode / annotate pool. Items cross process boundaries as JSON (`records.to_json`),
  never pickle. `ray.init(num_cpus=..., include_dashboard=False)` starts a local instance unless
  one is running; with `address` ("auto", "HOST:PORT" or "ray://HOST:PORT") it joins an existing
  cluster, after probing its port and GCS so that a wrong address fails in seconds with
  `RayClusterError` (ray.init itself retries for minutes). Every node of such a cluster needs
  this project importable (the same image / venv with `vfm` installed, as `ray start` runs from
  it) and DST on storage all nodes reach (s3:// or a shared filesystem).

Both yield final items in completion order; the pipeline sorts manifests, so both give the same
manifests.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import socket
import time
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from vfm_core.curate.balance import BatchEvent, EventLog, ray_actor_events
from vfm_core.curate.records import Item, from_json, to_json
from vfm_core.curate.stage_base import Stage
from vfm_core.errors import UserError
from vfm_core.openmp import usable_cpus

log = logging.getLogger(__name__)


class RayClusterError(UserError, RuntimeError):
    """No Ray cluster answers at the given address (a user error: wrong address, cluster down)."""


def parse_ray_address(address: str) -> tuple[str, int] | None:
    """`(host, port)` of "HOST:PORT" or "ray://HOST:PORT"; None for "auto"; ValueError otherwise."""
    if address == "auto":
        return None
    hostport = address.removeprefix("ray://")
    host, sep, port = hostport.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(
            f"ray address: expected 'auto', 'HOST:PORT' or 'ray://HOST:PORT', got {address!r}"
        )
    return host.strip("[]"), int(port)


def probe_ray_address(address: str, *, timeout_s: float = 5.0) -> str:
    """The concrete address to pass to `ray.init`; raises `RayClusterError` when nothing listens.

    "auto" resolves like Ray does (RAY_ADDRESS, else the last `ray start` on this machine). The
    TCP port is probed first (refused / silent in `timeout_s`), then Ray's own GCS client asks
    for the cluster id with the same deadline (catches a port held by something else, e.g. a
    proxy); a "ray://" (Ray Client) address gets the TCP probe only.
    """
    if address == "auto":
        from ray._private.services import canonicalize_bootstrap_address  # noqa: PLC2701

        try:
            resolved = canonicalize_bootstrap_address("auto")
        except (ConnectionError, ValueError) as e:  # Ray: "Could not find any running Ray instance"
            raise RayClusterError(f"ray address 'auto': {e}") from None
        if not resolved:
            raise RayClusterError(
                "ray address 'auto': no running Ray cluster found (RAY_ADDRESS unset and no "
                "`ray start` on this machine)"
            )
        address = resolved
    host, port = parse_ray_address(address)  # type: ignore[misc]

    def fail(why: str) -> RayClusterError:
        return RayClusterError(
            f"no Ray cluster answers at {address} ({why}); start one with `ray start --head` "
            "or pass the head's HOST:PORT"
        )

    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            pass
    except OSError as e:
        why = f"no answer within {timeout_s:g} s" if isinstance(e, TimeoutError) else e.strerror
        raise fail((why or str(e)).lower()) from None
    if address.startswith("ray://"):
        return address
    try:
        from ray._raylet import InnerGcsClient  # Ray's GCS client, with a deadline  # noqa: PLC2701
    except ImportError:  # a Ray without it: the TCP probe has to do
        return address
    try:
        InnerGcsClient.standalone(f"{host}:{port}", None, int(timeout_s * 1000))
    except Exception as e:  # ray.exceptions.RpcError: not a Ray GCS, or it does not answer
        raise fail(f"not a Ray GCS: {(str(e).splitlines() or [type(e).__name__])[0]}") from None
    return address


@runtime_checkable
class Executor(Protocol):
    """Runs stages over items, yielding the last stage's outputs as they complete."""

    def run(self, stages: Sequence[Stage], items: Iterable[Item]) -> Iterator[Item]: ...


def share_cpus(jobs: int) -> int:
    """Threads for each of `jobs` run side by side, at most `usable_cpus()` at once: the CPUs
    those leave, shared out (one each when there are as many jobs as CPUs, all for one job)."""
    n = usable_cpus()
    return max(1, n // max(1, min(jobs, n)))


@dataclass(kw_only=True, slots=True)
class LocalExecutor:
    """Every stage in this process on `workers` threads, one item per call, deepest work first:
    an item waiting for a later stage is taken before one waiting for an earlier stage, and a
    new input only when no started one has work waiting."""

    workers: int | None = None
    """Items processed at once (None: `vfm_core.openmp.usable_cpus()`; 1: one after another)."""

    def __post_init__(self) -> None:
        if self.workers is not None and self.workers < 1:
            raise ValueError(f"LocalExecutor.workers: expected >= 1 or None, got {self.workers}")

    def run(self, stages: Sequence[Stage], items: Iterable[Item]) -> Iterator[Item]:
        for s in stages:
            s.setup()
        n = self.workers or usable_cpus()
        if n == 1:
            yield from self._serial(stages, items)
        else:
            yield from self._threaded(stages, items, n)

    @staticmethod
    def _serial(stages: Sequence[Stage], items: Iterable[Item]) -> Iterator[Item]:
        for item in items:
            batch: list[Item] = [item]
            for s in stages:
                batch = [y for x in batch for y in s.process([x])]
            yield from batch

    @staticmethod
    def _threaded(stages: Sequence[Stage], items: Iterable[Item], n: int) -> Iterator[Item]:
        inputs = iter(items)
        waiting: list[tuple[int, int, Item]] = []  # heap of (-stage index, order, item)
        running: dict[Future, int] = {}  # -> stage index
        order = itertools.count()
        pool = ThreadPoolExecutor(max_workers=n, thread_name_prefix="vfm-curate")
        try:
            while True:
                while len(running) < n:
                    if waiting:
                        neg, _, item = heapq.heappop(waiting)
                        i = -neg
                    elif (item := next(inputs, _END)) is not _END:
                        i = 0
                    else:
                        break
                    running[pool.submit(stages[i].process, [item])] = i
                if not running:
                    return
                done, _ = wait(running, return_when=FIRST_COMPLETED)
                for f in done:
                    i = running.pop(f)
                    outs = f.result()  # a stage's own failure (not a reject) ends the run
                    if i + 1 == len(stages):
                        yield from outs
                    else:
                        for y in outs:
                            heapq.heappush(waiting, (-(i + 1), next(order), y))
        finally:  # on failure or an abandoned generator: started items finish, none start
            pool.shutdown(wait=True, cancel_futures=True)


_END = object()


class _StageActor:
    """A Ray actor holding one stage: setup once, then JSON rows in, JSON rows out. With an
    event sink (an `EventLog` actor), it reports its setup and every batch there."""

    def __init__(self, stage: Stage, sink: Any = None) -> None:
        t, c = time.time(), time.process_time()
        self.stage, self.sink = stage, sink
        stage.setup()
        self._record("setup", t, c, 0, 0)

    def __call__(self, batch: dict[str, Any]) -> dict[str, Any]:
        import numpy as np

        t, c = time.time(), time.process_time()
        items = [from_json(str(x)) for x in batch["row"]]
        out = self.stage.process(items)
        rows = np.asarray([to_json(o) for o in out], dtype=object)
        self._record("batch", t, c, len(items), len(out))
        return {"row": rows}

    def _record(self, kind: str, start: float, cpu: float, n_in: int, n_out: int) -> None:
        if self.sink is None:
            return
        import ray

        ev = BatchEvent(
            stage=self.stage.name,
            actor=ray.get_runtime_context().get_actor_id(),
            kind=kind,
            start=start,
            end=time.time(),
            n_in=n_in,
            n_out=n_out,
            cpu_s=time.process_time() - cpu,
        )  # type: ignore[arg-type]
        ray.get(self.sink.record.remote(ev.to_json()))  # acknowledged: none lost when Ray
        # removes the actor right after its last batch


@dataclass(kw_only=True, slots=True)
class RayExecutor:
    """Ray Data streaming executor with an autoscaled (or fixed) actor pool per stage."""

    num_cpus: int = 2
    """CPUs of the local Ray instance started by `run` (ignored when connecting)."""
    address: str | None = None
    """Ray cluster address: "auto", "HOST:PORT" or "ray://HOST:PORT" (None: a local instance, or
    the one already initialised)."""
    connect_timeout_s: float = 5.0
    """Seconds the cluster's port (then its GCS) has to answer before `RayClusterError`."""
    max_workers: int = 2
    """Largest actor pool of one stage (autoscaled pools)."""
    pool_size: int | None = None
    """None: autoscaled pools (1..max_workers actors); n: a fixed pool of n actors per stage."""
    cpus_per_worker: float | None = None
    """CPUs reserved per actor (None: 0.9 x the cluster's CPUs / the actor slots the pools need:
    stages - 1 + max_workers when autoscaled, stages x pool_size when fixed)."""
    record_events: bool = False
    """Stage actors report their setup and batches; `events` holds them after `run`."""
    events: list[BatchEvent] = field(default_factory=list, init=False, repr=False)
    """The `BatchEvent`s of the last run (with `record_events`)."""
    object_store_mb: int = 256
    """Object store size of a local instance."""
    progress: bool = False
    """Ray Data progress bars."""

    def __post_init__(self) -> None:
        if self.address is not None:
            parse_ray_address(self.address)  # a malformed address fails before any work
        if self.pool_size is not None and self.pool_size < 1:
            raise ValueError(f"RayExecutor.pool_size: expected >= 1 or None, got {self.pool_size}")
        if self.max_workers < 1:
            raise ValueError(f"RayExecutor.max_workers: expected >= 1, got {self.max_workers}")
        if self.num_cpus < 1:  # a local instance without CPUs schedules nothing: a hang
            raise ValueError(
                f"RayExecutor.num_cpus (--ray-cpus): expected >= 1, got {self.num_cpus}"
            )

    def run(self, stages: Sequence[Stage], items: Iterable[Item]) -> Iterator[Item]:
        import ray

        started = False
        if not ray.is_initialized():
            if self.address:
                address = probe_ray_address(self.address, timeout_s=self.connect_timeout_s)
                log.info("connecting to the Ray cluster at %s", address)
                ray.init(address=address, log_to_driver=False)
            else:
                ray.init(
                    num_cpus=self.num_cpus,
                    include_dashboard=False,
                    log_to_driver=False,
                    object_store_memory=self.object_store_mb * 1024 * 1024,
                )
            started = True
        try:
            yield from self._run(stages, list(items))
        finally:
            if started:
                ray.shutdown()

    def _run(self, stages: Sequence[Stage], items: list[Item]) -> Iterator[Item]:
        import ray
        from ray.data import DataContext

        self.events = []
        if not items:
            return
        ctx = DataContext.get_current()
        ctx.enable_progress_bars = self.progress
        ctx.execution_options.preserve_order = False
        total = float(ray.available_resources().get("CPU", self.num_cpus))
        nodes = sum(1 for n in ray.nodes() if n.get("Alive") and n["Resources"].get("CPU"))
        fixed = self.pool_size is not None
        # actor slots: every fixed pool full, or one autoscaled pool at max_workers and the
        # others at 1. They must fit node by node: each of n nodes wastes < 1 share x to bin
        # packing, so x <= total / (slots + n - 1) places them all
        slots = len(stages) * self.pool_size if fixed else len(stages) - 1 + self.max_workers
        share = total / (max(slots, 1) + max(nodes - 1, 0))
        cpus = self.cpus_per_worker or max(0.01, round(share * 0.9, 3))
        sink = ray.remote(num_cpus=0)(EventLog).remote() if self.record_events else None
        t_start = time.time()
        # one item per block (a Dataset keeps the context it was built with): a stage's outputs
        # are separate tasks downstream, so the spans of one video are transcoded and annotated
        # by the whole pool, not one after another inside one 1-block task
        block_size, ctx.target_max_block_size = ctx.target_max_block_size, 1
        try:
            ds = self._dataset(stages, items, cpus=cpus, sink=sink)
        finally:
            ctx.target_max_block_size = block_size
        for row in ds.iter_rows():
            yield from_json(str(row["row"]))
        if sink is not None:
            self.events = [BatchEvent.from_json(r) for r in ray.get(sink.rows.remote())]
            self.events += ray_actor_events({s.name.title(): s.name for s in stages}, since=t_start)
            ray.kill(sink)

    def _dataset(self, stages: Sequence[Stage], items: list[Item], *, cpus: float, sink: Any):
        """One actor-pool map per stage over the items (JSON rows), batches of one item."""
        import ray
        from ray.data import ActorPoolStrategy

        ds = ray.data.from_items(
            [{"row": to_json(x)} for x in items], override_num_blocks=len(items)
        )
        fixed = self.pool_size is not None
        for s in stages:
            # a subclass per stage so Ray's plan and logs name the pools (MapBatches(Transcode))
            actor = type(s.name.title(), (_StageActor,), {"__module__": __name__})
            ds = ds.map_batches(
                actor,
                fn_constructor_kwargs={"stage": s, "sink": sink},
                batch_size=1,
                batch_format="numpy",
                compute=ActorPoolStrategy(size=self.pool_size)
                if fixed
                else ActorPoolStrategy(min_size=1, max_size=self.max_workers),
                num_cpus=cpus,
            )
        return ds


def get_executor(name: str | Executor, **kw: Any) -> Executor:
    """ "local" | "ray" | an Executor instance."""
    if not isinstance(name, str):
        return name
    if name == "local":
        return LocalExecutor()
    if name == "ray":
        return RayExecutor(**kw)
    raise ValueError(f"executor: unknown {name!r}; expected 'local' or 'ray'")
