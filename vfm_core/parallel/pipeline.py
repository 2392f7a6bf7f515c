"""Pipeline parallelism for the DiT with ``torch.distributed.pipelining`` (GPipe or 1F1B).

Stages own contiguous blocks (the ``nn.ModuleDict`` keeps the single-device parameter names).
What crosses a stage boundary is the token stream ``h`` (B, N, D) plus the raw conditioning inputs
``c_noise`` (B,) and ``text`` (B, L, Dt): every stage **recomputes** the timestep embedding and the
AdaLN-LoRA global term from them with its own replica of ``t_embedder`` / ``adaln_global`` instead
of receiving the embeddings (paper §4: cheaper than sending them and their gradients), and
:func:`sync_pipeline_grads` all-reduces those replicas' gradients over the pipeline group.

The EDM loss moves to the last stage in an exactly equivalent form: with
lambda(sigma) * c_out(sigma)^2 = 1 (EDM Table 1), lambda * |c_skip x + c_out F - x0|^2 equals
|F - (x0 - c_skip x) / c_out|^2, so the last stage needs only F and that target.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

from vfm_core.config import ConfigError
from vfm_core.models.layers import Grid, patchify, rope_3d, unpatchify
from vfm_core.parallel.dims import ParallelDims

REPLICATED = ("t_embedder.", "adaln_global.")
"""Parameters every stage holds a copy of (conditioning recomputed per stage)."""


def stage_blocks(depth: int, pp: int, stage: int) -> list[str]:
    """Contiguous, balanced block indices of ``stage`` (earlier stages take the remainder)."""
    if depth < pp:
        raise ConfigError(f"parallel.pp: {pp} stages need at least {pp} blocks, depth is {depth}")
    per, rem = divmod(depth, pp)
    start = stage * per + min(stage, rem)
    return [str(i) for i in range(start, start + per + (stage < rem))]


class DiTStage(nn.Module):
    """One pipeline stage of a DiT: (x_in | h, c_noise, text) -> (h, c_noise, text) | F."""

    def __init__(self, model: nn.Module, *, stage: int, num_stages: int, grid: Grid):
        super().__init__()
        self.cfg, self.grid = model.cfg, grid
        self.first, self.last = stage == 0, stage == num_stages - 1
        keep = stage_blocks(model.cfg.depth, num_stages, stage)
        self.x_embedder = model.x_embedder if self.first else None
        self.t_embedder = model.t_embedder
        self.adaln_global = model.adaln_global
        self.blocks = nn.ModuleDict({k: model.blocks[k] for k in keep})
        self.final = model.final if self.last else None

    def forward(self, x: torch.Tensor, c_noise: torch.Tensor, text: torch.Tensor):
        cfg, grid = self.cfg, self.grid
        if self.first:
            tokens, grid = patchify(x, cfg.patch)  # (B, N, C*P)
            h = self.x_embedder(tokens)  # (B, N, D)
        else:
            h = x  # (B, N, D) from the previous stage
        emb = self.t_embedder(c_noise)  # (B, D) recomputed on this stage
        shared = self.adaln_global(emb) if self.adaln_global is not None else None  # (B, 3D)
        rope = rope_3d(grid, cfg.head_dim, cfg.rope_theta, device=h.device)  # (N, d/2)
        txt = text.to(h.dtype)
        for block in self.blocks.values():
            h = block(h, emb, shared, txt, rope, grid)  # (B, N, D)
        if self.last:
            out = self.final(h, emb)  # (B, N, C*P)
            return unpatchify(out, grid, cfg.patch, cfg.in_channels)  # (B, C, T, H, W)
        return h, c_noise, text


def _mse(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return (output - target).square().flatten(1).mean(1).mean()  # microbatch mean


class DiTPipeline:
    """A stage of ``model`` on this rank and its schedule; :meth:`step` runs one EDM step."""

    def __init__(
        self,
        model: nn.Module,
        *,
        parallel_dims: ParallelDims,
        grid: Grid,
        microbatches: int,
        schedule: str = "1f1b",
    ):
        dims = parallel_dims
        if dims.pp < 2:
            raise ConfigError("DiTPipeline: parallel.pp must be >= 2")
        if (dims.dp_shard, dims.dp_replicate, dims.tp, dims.cp) != (1, 1, 1, 1):
            raise ConfigError("parallel.pp: combining PP with other degrees is not available yet")
        mesh = dims.build_mesh(next(model.parameters()).device.type)
        self.group = mesh["pp"].get_group()
        self.rank, self.size = dims.coord("pp"), dims.pp
        self.module = DiTStage(model, stage=self.rank, num_stages=self.size, grid=grid)
        device = next(model.parameters()).device
        self.stage = PipelineStage(self.module, self.rank, self.size, device, group=self.group)
        kinds = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}
        if schedule not in kinds:
            raise ConfigError(f"pipeline schedule {schedule!r} unknown (gpipe | 1f1b)")
        self.microbatches = microbatches
        self.schedule = kinds[schedule](self.stage, n_microbatches=microbatches, loss_fn=_mse)

    def step(self, edm, x0, text, *, sigma, noise) -> torch.Tensor | None:
        """Forward + backward of the EDM loss over the microbatches; returns the batch-mean loss
        on the last stage (None elsewhere). Call :func:`sync_pipeline_grads` afterwards."""
        if x0.shape[0] % self.microbatches:
            raise ValueError(
                f"batch of {x0.shape[0]} samples cannot be split into {self.microbatches} "
                "microbatches"
            )
        c_skip, c_out, c_in, c_noise = edm.precondition(sigma)  # (B,) each
        shape = (-1,) + (1,) * (x0.ndim - 1)
        x = x0 + sigma.reshape(shape) * noise  # (B, C, T, H, W) noisy
        x_in = (c_in.reshape(shape) * x).to(x0.dtype)
        target = ((x0 - c_skip.reshape(shape) * x) / c_out.reshape(shape)).to(x0.dtype)
        losses: list = []
        if self.rank == 0:
            self.schedule.step(x_in, c_noise.to(x0.dtype), text.to(x0.dtype))
        elif self.rank == self.size - 1:
            self.schedule.step(target=target, losses=losses)
        else:
            self.schedule.step()
        if losses:
            return torch.stack([loss.detach() for loss in losses]).mean()
        return None


@torch.no_grad()
def sync_pipeline_grads(pipe: DiTPipeline) -> None:
    """Sum the gradients of the per-stage conditioning replicas over the pipeline group."""
    for name, p in pipe.module.named_parameters():
        if name.startswith(REPLICATED) and p.grad is not None:
            dist.all_reduce(p.grad, group=pipe.group)
