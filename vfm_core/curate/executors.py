"""Executors run a list of `Stage`s over input items and stream the final items back.

- `LocalExecutor` (default): in-process, depth-first per input item (a video is finished before
  the next one starts, so the resumable pipeline checkpoints early and memory stays flat).
- `RayExecutor`: Ray Data streaming execution of the same stage objects, one autoscaled actor
  pool per stage (`ActorPoolStrategy(min_size=1, max_size=...)`): Ray grows the pool of a stage
  whose input queue backs up, so slow stages (transcode) get more workers than fast ones (probe)
  -- the paper's auto-balancing. Each actor calls `stage.setup()` once. Items cross process
  boundaries as JSON (`records.to_json`), never pickle. `ray.init(num_cpus=..., include_dashboard=
  False)` starts a local instance unless one is running; with `address` ("auto", "HOST:PORT" or
  "ray://HOST:PORT") it joins an existing cluster, after probing its port and GCS so that a wrong
  address fails in seconds with `RayClusterError` (ray.init itself retries for minutes). Every
  node of such a cluster needs this project importable (the same image / venv with `vfm`
  installed, as `ray start` runs from it) and DST on storage all nodes reach (s3:// or a shared
  filesystem).

Both yield final items in completion order; the pipeline sorts manifests, so both give the same
manifests.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from vfm_core.curate.records import Item, from_json, to_json
from vfm_core.curate.stages import Stage

log = logging.getLogger(__name__)


class RayClusterError(RuntimeError):
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
        from ray._private.services import canonicalize_bootstrap_address

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
        from ray._raylet import InnerGcsClient  # Ray's GCS client, with a deadline
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


class LocalExecutor:
    """Every stage in this process, one input item at a time, depth first."""

    def run(self, stages: Sequence[Stage], items: Iterable[Item]) -> Iterator[Item]:
        for s in stages:
            s.setup()
        for item in items:
            batch: list[Item] = [item]
            for s in stages:
                batch = [y for x in batch for y in s.process([x])]
            yield from batch


class _StageActor:
    """A Ray actor holding one stage: setup once, then JSON rows in, JSON rows out."""

    def __init__(self, stage: Stage) -> None:
        self.stage = stage
        stage.setup()

    def __call__(self, batch: dict[str, Any]) -> dict[str, Any]:
        import numpy as np

        items = [from_json(str(x)) for x in batch["row"]]
        out = self.stage.process(items)
        return {"row": np.asarray([to_json(o) for o in out], dtype=object)}


@dataclass(kw_only=True, slots=True)
class RayExecutor:
    """Ray Data streaming executor with an autoscaled actor pool per stage."""

    num_cpus: int = 2
    """CPUs of the local Ray instance started by `run` (ignored when connecting)."""
    address: str | None = None
    """Ray cluster address: "auto", "HOST:PORT" or "ray://HOST:PORT" (None: a local instance, or
    the one already initialised)."""
    connect_timeout_s: float = 5.0
    """Seconds the cluster's port (then its GCS) has to answer before `RayClusterError`."""
    max_workers: int = 2
    """Largest actor pool of one stage."""
    cpus_per_worker: float | None = None
    """CPUs reserved per actor (None: num_cpus / number of stages, so every pool can start)."""
    object_store_mb: int = 256
    """Object store size of a local instance."""
    progress: bool = False
    """Ray Data progress bars."""

    def __post_init__(self) -> None:
        if self.address is not None:
            parse_ray_address(self.address)  # a malformed address fails before any work

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
                    num_cpus=self.num_cpus, include_dashboard=False, log_to_driver=False,
                    object_store_memory=self.object_store_mb * 1024 * 1024,
                )  # fmt: skip
            started = True
        try:
            yield from self._run(stages, list(items))
        finally:
            if started:
                ray.shutdown()

    def _run(self, stages: Sequence[Stage], items: list[Item]) -> Iterator[Item]:
        import ray
        from ray.data import ActorPoolStrategy, DataContext

        if not items:
            return
        ctx = DataContext.get_current()
        ctx.enable_progress_bars = self.progress
        ctx.execution_options.preserve_order = False
        total = float(ray.available_resources().get("CPU", self.num_cpus))
        nodes = sum(1 for n in ray.nodes() if n.get("Alive") and n["Resources"].get("CPU"))
        # one actor per stage must fit node by node: each of n nodes wastes < 1 share x to bin
        # packing, so x <= total / (stages + n - 1) places every pool (n = 1: total / stages)
        share = total / (len(stages) + max(nodes - 1, 0)) if stages else total
        cpus = self.cpus_per_worker or max(0.05, round(share * 0.9, 2))
        ds = ray.data.from_items(
            [{"row": to_json(x)} for x in items], override_num_blocks=len(items)
        )
        for s in stages:
            # a subclass per stage so Ray's plan and logs name the pools (MapBatches(Transcode))
            actor = type(s.name.title(), (_StageActor,), {"__module__": __name__})
            ds = ds.map_batches(
                actor,
                fn_constructor_kwargs={"stage": s},
                batch_size=1,
                batch_format="numpy",
                compute=ActorPoolStrategy(min_size=1, max_size=self.max_workers),
                num_cpus=cpus,
            )
        for row in ds.iter_rows():
            yield from_json(str(row["row"]))


def get_executor(name: str | Executor, **kw: Any) -> Executor:
    """"local" | "ray" | an Executor instance."""
    if not isinstance(name, str):
        return name
    if name == "local":
        return LocalExecutor()
    if name == "ray":
        return RayExecutor(**kw)
    raise ValueError(f"executor: unknown {name!r}; expected 'local' or 'ray'")
