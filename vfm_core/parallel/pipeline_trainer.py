"""PipelineTrainer: the spine's Trainer with its model split into pipeline stages (pp > 1).

Each rank holds one stage (:class:`vfm_core.parallel.pipeline.DiTPipeline`), optionally with TP
(+ SP) and FSDP2 / HSDP over the other ranks of its pipeline coordinate. One step, in order:

1. this rank takes its data-parallel slice of the global batch (with ``data.source: shards`` the
   loader hands each data-parallel rank its slice, as for ``ParallelTrainer``; batches must be
   full: the schedule splits them into ``pp`` equal microbatches);
2. sigma, noise and caption drop come from the counter-based :class:`StepRNG` (the same numbers
   as every other layout, one process included);
3. the 1F1B schedule runs forward + backward over the microbatches (the loss lives on the last
   stage);
4. :func:`sync_pipeline_grads`: TP partial sums, conditioning replicas summed over pp;
5. global gradient-norm clip over all stages (:func:`clip_grad_norm_pp`), AdamW, LR schedule, EMA
   of this rank's stage;
6. the logged loss is the global-batch mean, summed over the last stage's ranks, on every rank.

Checkpoints: :class:`vfm_core.parallel.checkpoint.ParallelCheckpoint` as for ``ParallelTrainer``.
Each rank's state names its stage's tensors with the single-device names (``model.blocks.4.*``,
``optim.state.blocks.4.*``, ``ema.*``; the conditioning replicas once), the checkpoint holds the
union of all stages, so it loads under pp, in one process or under any other layout, and a
one-process (or FSDP2, TP) checkpoint loads into the stages.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.distributed as dist
from torch import nn

from vfm_core.config import Config, ConfigError, ParallelConfig
from vfm_core.data.samples import LatentBatch, LatentSource
from vfm_core.parallel.dims import ParallelDims
from vfm_core.parallel.pipeline import (
    REPLICATED,
    DiTPipeline,
    DiTStage,
    parallelize_stage,
    sync_pipeline_grads,
)
from vfm_core.parallel.rng import StepRNG
from vfm_core.parallel.trainer import GlobalMetrics, clip_grad_norm, trainer_source
from vfm_core.train.trainer import Trainer, TrainingDiverged, build_optimizer, resolve_device


def clip_grad_norm_pp(stage: nn.Module, max_norm: float, dims: ParallelDims) -> torch.Tensor:
    """Global L2 norm of the gradients of the whole pipelined model, then scale them to
    ``max_norm``; every parameter element counts once: a stage's own parameters are one of ``pp``
    disjoint parts, the conditioning replicas (``t_embedder``, ``adaln_global``: on every stage,
    gradients already summed over pp) are whole on each."""
    return clip_grad_norm(
        stage, max_norm, holders=lambda name: 1 if name.startswith(REPLICATED) else dims.pp
    )


class PipelineTrainer(GlobalMetrics, Trainer):
    """Trainer over one pipeline stage per rank (pp > 1); the source yields the global batch
    (``data.batch_size`` per data-parallel rank times ``dims.dp``), split into ``pp``
    microbatches per data-parallel rank."""

    def __init__(self, cfg: Config, *, dims: ParallelDims, source: LatentSource | None = None):
        p = cfg.parallel
        if not dims.pp_enabled:
            raise ConfigError("PipelineTrainer: parallel.pp must be >= 2 (use ParallelTrainer)")
        if cfg.data.batch_size % dims.pp:
            raise ConfigError(
                f"data.batch_size: {cfg.data.batch_size} samples per data-parallel rank cannot "
                f"be split into parallel.pp={dims.pp} microbatches (use a multiple of {dims.pp})"
            )
        single = dataclasses.replace(cfg, parallel=ParallelConfig())
        dims.build_mesh(resolve_device(cfg.train.device).type)
        source, self.local_batches = trainer_source(cfg, dims, source)
        # same seed on every rank: identical full init
        super().__init__(single, source=source, tp=dims.tp)
        self.cfg, self.dims = cfg, dims
        self.bf16 = cfg.train.dtype == "bfloat16" and self.device.type == "cuda"
        opts = dict(
            sequence_parallel=p.sequence_parallel,
            param_dtype=torch.bfloat16 if self.bf16 else None,
            reduce_dtype=torch.float32 if self.bf16 else None,
        )
        self.pipe = DiTPipeline(
            self.model,
            parallel_dims=dims,
            grid=self.grid,
            microbatches=dims.pp,
            schedule="1f1b",
            activation_checkpointing=p.activation_checkpointing,
            **opts,
        )
        self.model = self.pipe.module  # this rank's stage: what the optimizer and EMA see
        if self.ema is not None:  # the same stage of the EMA copy, sharded the same way
            rank = dims.coord("pp")
            ema = DiTStage(self.ema, stage=rank, num_stages=dims.pp, grid=self.grid)
            self.ema = parallelize_stage(ema, dims, **opts)
        self.optimizer, self.scheduler = build_optimizer(
            self.model, cfg.optim, cfg.train.steps, foreach=False
        )
        self.step_rng = StepRNG.from_dims(cfg.train.seed + 1, dims)
        self.world = dist.get_world_size()

    def train_step(self, batch: LatentBatch) -> dict[str, float]:
        b = self.cfg.data.batch_size
        if self.local_batches:
            latents, text = batch.latents, batch.text
        else:
            sl = slice(self.dims.dp_rank() * b, (self.dims.dp_rank() + 1) * b)
            latents, text = batch.latents[sl], batch.text[sl]
        if latents.shape[0] != b:  # the loader skipped bad samples
            raise ValueError(
                f"step {self.step + 1}: the loader gave {latents.shape[0]} of data.batch_size={b} "
                f"samples on data-parallel rank {self.dims.dp_rank()}; the pipeline schedule "
                "needs full batches (remove the bad samples from the shards)"
            )
        x0 = latents.to(self.device, torch.float32)  # (b, C, T, H, W)
        d = self.cfg.diffusion
        sigma = self.step_rng.sigma(self.step, b, p_mean=d.p_mean, p_std=d.p_std)  # (b,)
        sigma = sigma.to(self.device, torch.float32)
        noise = self.step_rng.noise(self.step, tuple(x0.shape)).to(self.device)  # (b, C, T, H, W)
        keep = self.step_rng.keep_caption(self.step, b, d.cond_dropout).to(self.device)  # (b,)
        text = text.to(self.device) * keep[:, None, None]  # (b, L, Dt)
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.bf16):
            loss = self.pipe.step(self.edm, x0, text, sigma=sigma, noise=noise)  # last stage
        sync_pipeline_grads(self.pipe)
        # the last stage's dp x tp ranks hold their slice's loss (equal over tp); others add 0
        total = torch.zeros((), dtype=torch.float32, device=self.device)
        if loss is not None:
            total += loss.detach().float()
        dist.all_reduce(total)
        mean = total.item() / (self.world // self.dims.pp)
        if not torch.isfinite(torch.tensor(mean)):
            self.optimizer.zero_grad(set_to_none=True)
            raise TrainingDiverged(
                f"loss is {mean} at step {self.step + 1}; stopped before the update, nothing was "
                "saved from this step (lower optim.lr or check the data)"
            )
        clip = self.cfg.optim.grad_clip or float("inf")
        grad_norm = clip_grad_norm_pp(self.model, clip, self.dims)
        lr = self.update(grad_norm)
        return {"loss": mean, "grad_norm": grad_norm.item(), "lr": lr}

    def meta(self):
        return {**super().meta(), "parallel": dataclasses.asdict(self.cfg.parallel)}
