"""``vfm plan --check``: memory you can check before you rent the cluster.

The real model is built under the real layout at world size N in one process: a fake process
group (``torch.testing._internal.distributed.fake_pg``, every collective a no-op) stands in for
the N ranks, and the model is constructed exactly as the trainer constructs it
(:func:`vfm_core.parallel.apply.build_parts`: meta device -> pipeline stages -> TP / CP / FSDP2),
so every parameter is already the DTensor shard a rank would hold, with its local shape, and no
memory is touched (torchtitan's memory estimation works the same way). For each pipeline rank
(the rank with that pipeline coordinate and all others 0; FSDP's first shard is the largest)
the bytes of the model states follow from the local shapes and dtypes: the parameters, their
gradients (same shape, fp32), the AdamW moments (two per parameter) and the EMA (one per
parameter when ``train.ema_decay`` > 0). They are printed beside the planner's memory model
(:mod:`vfm_core.perf.memory`) for the busiest rank.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

import torch.distributed as dist
from torch.distributed.tensor import DTensor

from vfm_core.config import Config, ConfigError
from vfm_core.perf.memory import GiB

COMPONENTS = ("params", "grads", "optimizer", "ema")


@dataclass(kw_only=True, slots=True)
class StateBytes:
    """Model-state bytes of one rank, by component."""

    params: float
    grads: float
    optimizer: float
    ema: float

    @property
    def total(self) -> float:
        return self.params + self.grads + self.optimizer + self.ema

    def as_dict(self) -> dict[str, float]:
        return {k: getattr(self, k) for k in COMPONENTS}


@contextlib.contextmanager
def fake_world(rank: int, world: int) -> Iterator[None]:
    """A fake process group of ``world`` ranks seen from ``rank`` (no communication)."""
    from torch.testing._internal.distributed.fake_pg import FakeStore  # noqa: PLC2701

    if dist.is_initialized():
        raise RuntimeError("vfm plan --check needs a process without a process group")
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world)
    try:
        yield
    finally:
        dist.destroy_process_group()


def measure_rank(cfg: Config, world: int, pp_rank: int) -> StateBytes:
    """State bytes of the rank with pipeline coordinate ``pp_rank`` (all other coordinates 0)
    under ``cfg.parallel`` on ``world`` ranks, from the local shard shapes of the real model."""
    from vfm_core.parallel.apply import build_parts
    from vfm_core.parallel.layout import validate_layout

    with fake_world(pp_rank * (world // cfg.parallel.pp), world):
        dims = validate_layout(cfg, world)
        dims.build_mesh("cpu")
        parts = build_parts(cfg, dims, device="meta")
        local = [
            p.to_local() if isinstance(p, DTensor) else p
            for part in parts
            for p in part.parameters()
        ]
    weights = float(sum(t.numel() * t.element_size() for t in local))
    fp32 = float(sum(t.numel() * 4 for t in local))
    ema = weights if cfg.train.ema_decay else 0.0
    return StateBytes(params=weights, grads=fp32, optimizer=2 * weights, ema=ema)


def measure_states(cfg: Config, world: int) -> list[StateBytes]:
    """:func:`measure_rank` for every pipeline rank."""
    return [measure_rank(cfg, world, r) for r in range(cfg.parallel.pp)]


def report_row(measured: float, planned: float) -> dict[str, float]:
    """``measured_bytes``, ``planned_bytes`` and the plan's relative difference from the
    measurement (0 when nothing was measured)."""
    diff = (planned - measured) / measured if measured else 0.0
    return {"measured_bytes": measured, "planned_bytes": planned, "rel_diff": diff}


def check_report(measured: StateBytes, planned: StateBytes) -> dict[str, dict[str, float]]:
    """Per component: ``measured_bytes``, ``planned_bytes`` and their relative difference."""
    keys = (*COMPONENTS, "total")
    return {k: report_row(getattr(measured, k), getattr(planned, k)) for k in keys}


def format_check(report: dict[str, dict[str, float]], *, header: bool = True) -> str:
    """A table of the check's components in GiB (diff: the plan against the measurement; '-'
    where the plan has no such term)."""
    lines = [f"{'component':12s} {'measured GiB':>13s} {'planned GiB':>12s} {'diff':>8s}"]
    for key, row in report.items():
        diff = f"{row['rel_diff']:>+8.1%}" if row["planned_bytes"] else f"{'-':>8s}"
        lines.append(
            f"{key:12s} {row['measured_bytes'] / GiB:>13.3f} {row['planned_bytes'] / GiB:>12.3f} "
            f"{diff}"
        )
    return "\n".join(lines if header else lines[1:])


def planned_states(memory) -> StateBytes:
    """The planner's :class:`~vfm_core.perf.memory.MemoryEstimate` as bytes by component."""
    return StateBytes(
        params=memory.params_gib * GiB,
        grads=memory.grads_gib * GiB,
        optimizer=memory.optimizer_gib * GiB,
        ema=memory.ema_gib * GiB,
    )


def busiest(measured: list[StateBytes]) -> tuple[int, StateBytes]:
    """(pipeline rank, its bytes) of the rank holding the most model state."""
    if not measured:
        raise ConfigError("vfm plan --check: nothing measured")
    r = max(range(len(measured)), key=lambda i: measured[i].total)
    return r, measured[r]
