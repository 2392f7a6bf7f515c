"""Executors run a list of `Stage`s over input items and stream the final items back.

- `LocalExecutor` (default): in-process, depth-first per input item (a video is finished before
  the next one starts, so the resumable pipeline checkpoints early and memory stays flat).
- `RayExecutor`: Ray Data streaming execution of the same stage objects, one autoscaled actor
  pool per stage (`ActorPoolStrategy(min_size=1, max_size=...)`): Ray grows the pool of a stage
  whose input queue backs up, so slow stages (transcode) get more workers than fast ones (probe)
  -- the paper's auto-balancing. Each actor calls `stage.setup()` once. Items cross process
  boundaries as JSON (`records.to_json`), never pickle. `ray.init(num_cpus=..., include_dashboard=
  False)` starts a local instance unless one is running (or `address` is given).

Both yield final items in completion order; the pipeline sorts manifests, so both give the same
manifests.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from vfm_core.curate.records import Item, from_json, to_json
from vfm_core.curate.stages import Stage

log = logging.getLogger(__name__)


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
    """Ray cluster address (None: a local instance, or the one already initialised)."""
    max_workers: int = 2
    """Largest actor pool of one stage."""
    cpus_per_worker: float | None = None
    """CPUs reserved per actor (None: num_cpus / number of stages, so every pool can start)."""
    object_store_mb: int = 256
    """Object store size of a local instance."""
    progress: bool = False
    """Ray Data progress bars."""

    def run(self, stages: Sequence[Stage], items: Iterable[Item]) -> Iterator[Item]:
        import ray

        started = False
        if not ray.is_initialized():
            if self.address:
                ray.init(address=self.address, include_dashboard=False, log_to_driver=False)
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
        cpus = self.cpus_per_worker or max(0.05, round(total / max(len(stages), 1) * 0.9, 2))
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
