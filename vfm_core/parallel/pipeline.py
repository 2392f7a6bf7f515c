"""Pipeline parallelism (``torch.distributed.pipelining``: GPipe, 1F1B, interleaved 1F1B) for the
DiT family and the causal video transformer, combined with TP / SP, CP and FSDP2 inside every stage.

**Stages.** The depth is cut into ``pp x v`` contiguous stages (:func:`stage_blocks`); rank r
holds stages r, r + pp, ..., r + (v-1) pp (v = ``parallel.pp_virtual_stages``; the placement
torch's interleaved schedule expects). A stage is the model itself with the other stages' parts
removed (:func:`split_stage`): its own blocks, the input embedding on the first stage only, the
output layer on the last only, the single-device parameter names kept. The model's own forward
then takes and returns the hidden stream, so :func:`~vfm_core.parallel.parallelize.
parallelize_dit` applies TP / SP, CP (ring / all-to-all attention inside every stage) and FSDP2
to a stage exactly as to the whole model.

**What crosses a stage boundary** is the token stream ``h`` of this rank's sequence chunk
(B, N / (cp x tp_sp), D), sent to the rank with the same (dp, cp, tp) coordinates on the next
stage, plus the microbatch index. The conditioning (c_noise, caption, pack layout, grid) is not
sent: every rank of a pipeline already holds its data-parallel slice of the batch, and a forward
pre-hook on every stage looks up its microbatch's conditioning by that index. Every stage
**recomputes** the timestep embedding and the AdaLN-LoRA global term from it with its own replica
of ``t_embedder`` / ``adaln_global`` (paper §4: cheaper than sending the embeddings and their
gradients); :meth:`Pipeline.sync_replicas` sums those replicas' gradients over the stages.

**Loss.** The last stage hands the model output to the objective's loss with the microbatch
(:class:`Pipeline`'s ``loss_fn``); losses arrive pre-weighted as each microbatch's share of the
global mean, so gradients are never rescaled by the microbatch count.

**Receive buffers** live only while their microbatch is in flight
(:class:`~vfm_core.parallel.lean_stage.LeanStage`), not the whole step for every microbatch.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.pipelining import (
    Schedule1F1B,
    ScheduleGPipe,
    ScheduleInterleaved1F1B,
)
from torch.distributed.tensor import DTensor

from vfm_core.config import ConfigError
from vfm_core.models.layers import has_values
from vfm_core.parallel.dims import ParallelDims
from vfm_core.parallel.lean_stage import LeanStage


def replicated(model: nn.Module) -> tuple[str, ...]:
    """Name prefixes of the parameters every stage holds a replica of: the model's
    ``STAGE_ALL`` modules (conditioning recomputed per stage)."""
    return tuple(f"{name}." for name in getattr(model, "STAGE_ALL", ()))


SCHEDULES = {
    "gpipe": ScheduleGPipe,
    "1f1b": Schedule1F1B,
    "interleaved_1f1b": ScheduleInterleaved1F1B,
}
"""``parallel.pp_schedule`` -> torch schedule (the last one runs several stages per rank)."""


class ModelCall(Protocol):
    """What a stage needs of a microbatch: the first stage's input and every stage's kwargs."""

    inputs: torch.Tensor
    kwargs: dict[str, Any]


def stage_blocks(depth: int, stages: int, stage: int) -> list[str]:
    """Contiguous, balanced block indices of ``stage`` of ``stages`` (earlier stages take the
    remainder)."""
    if depth < stages:
        raise ConfigError(
            f"parallel.pp: {stages} pipeline stages need at least {stages} blocks, depth is {depth}"
        )
    per, rem = divmod(depth, stages)
    start = stage * per + min(stage, rem)
    return [str(i) for i in range(start, start + per + (stage < rem))]


def rank_stages(dims: ParallelDims, virtual: int) -> list[int]:
    """The stage indices this rank runs: r, r + pp, ... (``virtual`` of them)."""
    r = dims.coord("pp")
    return [r + k * dims.pp for k in range(virtual)]


def split_stage(model: nn.Module, *, stage: int, stages: int) -> nn.Module:
    """Stage ``stage`` of ``stages`` of ``model`` (best built on the ``meta`` device: the copy
    is then free): a copy without the other stages' blocks, with the model's ``STAGE_FIRST``
    modules on the first stage only and ``STAGE_LAST`` on the last only."""
    keep = set(stage_blocks(model.cfg.depth, stages, stage))
    part = copy.deepcopy(model)
    for name in [k for k in part.blocks if k not in keep]:
        del part.blocks[name]
    if stage != 0:
        for name in part.STAGE_FIRST:
            setattr(part, name, None)
    if stage != stages - 1:
        for name in part.STAGE_LAST:
            setattr(part, name, None)
    return part


class Pipeline:
    """This rank's stages and their schedule over ``microbatches`` microbatches per run.

    ``parts``: this rank's stage modules (parallelised, materialised), in
    :func:`rank_stages` order; ``loss_fn(output, microbatch)``: the objective's loss of the last
    stage's output (the microbatch's share of the global mean)."""

    def __init__(
        self,
        parts: Sequence[nn.Module],
        *,
        dims: ParallelDims,
        schedule: str,
        microbatches: int,
        loss_fn: Callable[[Any, ModelCall], torch.Tensor],
        device: torch.device,
    ):
        if schedule not in SCHEDULES:
            raise ConfigError(
                f"parallel.pp_schedule {schedule!r} unknown ({' | '.join(SCHEDULES)})"
            )
        virtual = len(parts)
        if virtual > 1 and schedule != "interleaved_1f1b":
            raise ConfigError(f"{virtual} stages per rank need pp_schedule interleaved_1f1b")
        self.dims, self.parts, self.microbatches = dims, list(parts), microbatches
        self.group = dims.group("pp")
        self.current: list[ModelCall] = []
        self._index: torch.Tensor | None = None  # the microbatch index of the stage running
        stages = dims.pp * virtual
        self.stages = []
        for part, index in zip(self.parts, rank_stages(dims, virtual), strict=True):
            part.register_forward_pre_hook(self._conditioning, with_kwargs=True)
            if index != stages - 1:  # the index travels on with the hidden stream
                part.register_forward_hook(self._pass_index)
            self.stages.append(LeanStage(part, index, stages, device, group=self.group))
        self.last = self.stages[-1].is_last

        def loss(output, index: torch.Tensor) -> torch.Tensor:
            return loss_fn(output, self.current[self._microbatch(index)])

        kind = SCHEDULES[schedule]
        stage_arg = self.stages if kind is ScheduleInterleaved1F1B else self.stages[0]
        self.schedule = kind(
            stage_arg, n_microbatches=microbatches, loss_fn=loss, scale_grads=False
        )

    def _conditioning(self, _module, args, kwargs):
        """Stage forward pre-hook: (x, microbatch index) -> (x,), that microbatch's kwargs. The
        schedule's first call per stage infers tensor shapes from uninitialised inputs, where the
        index is arbitrary: it is clamped to a valid microbatch (same shapes)."""
        x, index = args
        self._index = index
        return (x,), dict(self.current[self._microbatch(index)].kwargs)

    def _microbatch(self, index: torch.Tensor) -> int:
        """The microbatch an index tensor names, clamped to a valid one; 0 when its value cannot
        be read (``vfm plan --check``'s fake tensors: every microbatch has the same shapes)."""
        i = int(index.reshape(-1)[0]) if index.numel() and has_values(index) else 0
        return min(max(i, 0), len(self.current) - 1)

    def _pass_index(self, _module, _args, output):
        """Stage forward hook (all but the last stage): output -> (output, microbatch index)."""
        return output, self._index

    def run(self, microbatches: Sequence[ModelCall]) -> torch.Tensor | None:
        """Forward + backward of ``microbatches`` (the schedule's count) through the stages;
        returns the sum of their losses on the rank holding the last stage (None elsewhere)."""
        if len(microbatches) != self.microbatches:
            raise ValueError(
                f"the pipeline runs {self.microbatches} microbatches, got {len(microbatches)}"
            )
        self.current = list(microbatches)
        first = self.current[0].inputs
        inputs = torch.cat([mb.inputs for mb in self.current])  # (M * b, ...)
        index = torch.arange(len(self.current), device=first.device)  # (M,)
        losses: list = []
        self.schedule.step(inputs, index, target=index, losses=losses)
        self.current = []
        if self.last:
            return torch.stack([loss.detach() for loss in losses]).sum()
        return None

    @torch.no_grad()
    def sync_replicas(self) -> None:
        """Sum the conditioning replicas' gradients over this rank's stages and the pipeline
        group, then give every replica the sum (one all-reduce)."""
        shared = replicated(self.parts[0])
        by_part = [
            [
                (p.grad.to_local() if isinstance(p.grad, DTensor) else p.grad)
                for name, p in part.named_parameters()
                if name.startswith(shared) and p.grad is not None
            ]
            for part in self.parts
        ]
        if not by_part[0]:
            return
        flat = torch.stack([torch.cat([g.reshape(-1) for g in grads]) for grads in by_part])
        total = flat.sum(0)
        dist.all_reduce(total, group=self.group)
        for grads in by_part:
            offset = 0
            for g in grads:
                g.copy_(total[offset : offset + g.numel()].view_as(g))
                offset += g.numel()
