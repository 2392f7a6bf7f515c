"""The layout a trainer runs, applied from outside to a single-device DiT and its EMA copy.

pp = 1: :func:`parallelize_dit` (TP/SP -> CP -> activation checkpointing -> FSDP2; with every
degree 1 it only records that no gradient needs syncing). pp > 1: this rank's pipeline stage
(:class:`DiTPipeline`: TP/SP, FSDP2 per stage, the 1F1B schedule over ``pp`` microbatches) and the
same stage of the EMA copy, sharded the same way. Either way the trainer gets the module its
optimizer updates and one call for the gradients' final sums.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from vfm_core.config import Config
from vfm_core.models.layers import Grid
from vfm_core.parallel.dims import ParallelDims
from vfm_core.parallel.grads import clip_grad_norm
from vfm_core.parallel.parallelize import parallelize_dit, sync_grads
from vfm_core.parallel.pipeline import (
    REPLICATED,
    DiTPipeline,
    make_stage,
    parallelize_stage,
    sync_pipeline_grads,
)


@dataclass(kw_only=True, slots=True)
class AppliedLayout:
    """What the trainer works with after the layout was applied."""

    model: nn.Module
    """The module the optimizer updates: the whole parallelized DiT, or this rank's stage."""
    ema: nn.Module | None
    """The EMA copy, parallelized like ``model`` (None without EMA)."""
    pipe: DiTPipeline | None
    """The pipeline schedule (pp > 1), else None."""
    dims: ParallelDims
    """The degrees it was applied with."""

    def sync_grads(self) -> None:
        """Make the gradients final after the backward: TP/SP partial sums (CP is summed inside
        FSDP's reduce-scatter) and, under PP, the conditioning replicas over the stages."""
        if self.pipe is not None:
            sync_pipeline_grads(self.pipe)
        else:
            sync_grads(self.model)

    def clip_grad_norm(self, max_norm: float) -> torch.Tensor:
        """Global gradient norm over every rank's pieces (each element counted once), clipped.
        A stage's own parameters are one of ``pp`` disjoint parts; the conditioning replicas
        every stage holds are whole on each."""
        pp = self.dims.pp
        return clip_grad_norm(
            self.model, max_norm, holders=lambda name: 1 if name.startswith(REPLICATED) else pp
        )


def apply_layout(
    model: nn.Module, ema: nn.Module | None, *, cfg: Config, dims: ParallelDims, grid: Grid
) -> AppliedLayout:
    """Apply ``cfg.parallel`` (degrees in ``dims``, mesh built) to ``model`` and ``ema``, which
    every rank built from the same seed (shards of one full init)."""
    p = cfg.parallel
    ac = p.activation_checkpointing and p.activation_checkpointing_mode  # False | full | selective
    device = next(model.parameters()).device
    bf16 = cfg.train.dtype == "bfloat16" and device.type == "cuda"
    opts = dict(
        sequence_parallel=p.sequence_parallel,
        param_dtype=torch.bfloat16 if bf16 else None,
        reduce_dtype=torch.float32 if bf16 else None,
    )
    if dims.pp_enabled:
        pipe = DiTPipeline(model, parallel_dims=dims, grid=grid, microbatches=dims.pp,
                           schedule="1f1b", activation_checkpointing=ac,
                           **opts)  # fmt: skip
        if ema is not None:
            stage = make_stage(ema, stage=dims.coord("pp"), num_stages=dims.pp, grid=grid)
            ema = parallelize_stage(stage, dims, **opts)
        return AppliedLayout(model=pipe.module, ema=ema, pipe=pipe, dims=dims)
    opts |= dict(parallel_dims=dims, cp_mode=p.cp_mode)
    if ema is not None:
        ema = parallelize_dit(ema, **opts, activation_checkpointing=False)
    model = parallelize_dit(model, **opts, activation_checkpointing=ac)
    return AppliedLayout(model=model, ema=ema, pipe=None, dims=dims)
