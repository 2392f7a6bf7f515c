"""Pipeline parallelism for the DiT (and the causal video transformer, :class:`ARStage`: token
ids in, logits out, the next-token loss on the last stage) with ``torch.distributed.pipelining``
(GPipe or 1F1B).

Stages own contiguous blocks (the ``nn.ModuleDict`` keeps the single-device parameter names).
What crosses a stage boundary is the token stream ``h`` (B, N, D) plus the raw conditioning inputs
``c_noise`` (B,) and ``text`` (B, L, Dt): every stage **recomputes** the timestep embedding and the
AdaLN-LoRA global term from them with its own replica of ``t_embedder`` / ``adaln_global`` instead
of receiving the embeddings (paper §4: cheaper than sending them and their gradients), and
:func:`sync_pipeline_grads` all-reduces those replicas' gradients over the pipeline group.

The EDM loss moves to the last stage in an exactly equivalent form: with
lambda(sigma) * c_out(sigma)^2 = 1 (EDM Table 1), lambda * |c_skip x + c_out F - x0|^2 equals
|F - (x0 - c_skip x) / c_out|^2, so the last stage needs only F and that target.

Combined with other degrees (:func:`parallelize_stage`, same order as ``parallelize_dit``):
**TP (+ SP)** splits the stage's blocks with the same plan as the un-pipelined model; with SP the
first stage cuts the embedded tokens into this TP rank's chunk, the chunk (B, N/T, D) is what
crosses the stage boundary (to the same TP rank of the next stage) and the last stage gathers the
final layer's output. **FSDP2** shards the stage's blocks and the stage over the data-parallel
ranks of its pipeline coordinate; each data-parallel rank feeds its own slice of the global batch
through its pipeline and FSDP's reduce-scatter averages the gradients over dp. Gradient sums, in
order: FSDP over dp (inside the schedule's last backward), :func:`sync_grads` over tp (partial
sums of unsharded parameters), :func:`sync_pipeline_grads` over pp (conditioning replicas).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.parallel import parallelize_module

from vfm_core.config import ConfigError
from vfm_core.models.layers import (
    Grid,
    grid_positions,
    patchify,
    rope_3d,
    unpatchify,
    with_positions,
)
from vfm_core.parallel.context import gather_seq, seq_chunk
from vfm_core.parallel.dims import ParallelDims
from vfm_core.parallel.parallelize import GradSync, _tp_plan, sync_grads
from vfm_core.parallel.recompute import checkpoint_blocks

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
            tokens = with_positions(tokens, grid_positions(grid), cfg.abs_pos)  # (B, N, C*P + A)
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


class ARStage(nn.Module):
    """One pipeline stage of the causal video transformer: (ids | h, text) -> (h, text) | logits.
    Stage 0 embeds the BOS-shifted ids (B, N); every stage computes the RoPE angles of the grid
    and cross-attends to the text that travels along; the last stage ends with norm and head."""

    def __init__(self, model: nn.Module, *, stage: int, num_stages: int, grid: Grid):
        super().__init__()
        self.cfg, self.grid = model.cfg, grid
        self.first, self.last = stage == 0, stage == num_stages - 1
        keep = stage_blocks(model.cfg.depth, num_stages, stage)
        self.embed = model.embed if self.first else None
        self.blocks = nn.ModuleDict({k: model.blocks[k] for k in keep})
        self.norm = model.norm if self.last else None
        self.head = model.head if self.last else None

    def forward(self, x: torch.Tensor, text: torch.Tensor):
        h = self.embed(x) if self.first else x  # (B, N, D)
        rope = rope_3d(self.grid, self.cfg.head_dim, self.cfg.rope_theta, device=h.device)
        txt = text.to(h.dtype)
        for block in self.blocks.values():
            h = block(h, txt, rope)  # (B, N, D)
        if self.last:
            return self.head(self.norm(h))  # (B, N, V)
        return h, text


def make_stage(model: nn.Module, *, stage: int, num_stages: int, grid: Grid) -> nn.Module:
    """This rank's stage of a DiT or of the causal video transformer."""
    cls = ARStage if model.cfg.arch == "ar" else DiTStage
    return cls(model, stage=stage, num_stages=num_stages, grid=grid)


def parallelize_stage(
    stage: nn.Module,
    dims: ParallelDims,
    *,
    sequence_parallel: bool = True,
    activation_checkpointing: bool | str = False,
    param_dtype: torch.dtype | None = None,
    reduce_dtype: torch.dtype | None = None,
) -> nn.Module:
    """Apply TP (+ SP), activation checkpointing and FSDP2 to one pipeline stage in place (see the
    module docstring); sets ``stage.vfm_grad_sync`` for
    :func:`vfm_core.parallel.parallelize.sync_grads`."""
    mesh = dims.mesh
    cfg = stage.cfg
    if dims.tp_enabled and (cfg.heads % dims.tp or cfg.n_kv_heads % dims.tp):
        raise ConfigError(
            f"parallel.tp: {dims.tp} must divide model.heads={cfg.heads} and the key/value "
            f"heads {cfg.n_kv_heads}"
        )
    sp = sequence_parallel and dims.tp_enabled
    plain_before_tp = {n for n, p in stage.named_parameters() if not isinstance(p, DTensor)}
    if dims.tp_enabled:
        for block in stage.blocks.values():
            parallelize_module(block, mesh["tp"], _tp_plan(block, sp), src_data_rank=None)
    if sp:
        tp, tp_rank, tp_group = dims.tp, dims.coord("tp"), dims.group("tp")
        if stage.first:  # (B, N, D) -> (B, N/T, D): this TP rank's chunk crosses the boundary
            stage.x_embedder.register_forward_hook(lambda _m, _i, out: seq_chunk(out, tp_rank, tp))
        if stage.last:  # (B, N/T, C*P) -> (B, N, C*P)
            stage.final.register_forward_hook(lambda _m, _i, out: gather_seq(out, tp_group))
    groups = []
    if dims.tp_enabled:
        names = [n for n, p in stage.named_parameters() if not isinstance(p, DTensor)]
        names = [n for n in names if n in plain_before_tp]
        if not sp:  # only per-head QK norms see partial gradients without SP
            names = [n for n in names if ".q_norm." in n or ".k_norm." in n]
        groups.append((dims.group("tp"), names))
    stage.vfm_grad_sync = GradSync(groups=groups)
    checkpoint_blocks(stage.blocks, activation_checkpointing)  # parameter names unchanged
    if dims.fsdp_enabled:
        mp = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=reduce_dtype)
        fsdp_mesh = dims.fsdp_mesh()
        for block in stage.blocks.values():
            fully_shard(block, mesh=fsdp_mesh, mp_policy=mp)
        fully_shard(stage, mesh=fsdp_mesh, mp_policy=mp)
    return stage


def _mse(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return (output - target).square().flatten(1).mean(1).mean()  # microbatch mean


def _next_token(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    from vfm_core.models.ar import next_token_loss

    return next_token_loss(logits, target)  # microbatch mean over its tokens


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
        sequence_parallel: bool = True,
        activation_checkpointing: bool | str = False,
        param_dtype: torch.dtype | None = None,
        reduce_dtype: torch.dtype | None = None,
    ):
        dims = parallel_dims
        if dims.pp < 2:
            raise ConfigError("DiTPipeline: parallel.pp must be >= 2")
        if dims.cp_enabled:
            raise ConfigError(
                "parallel.pp: combining PP with context parallelism (cp > 1) is not available "
                "yet (PP combines with dp_shard, dp_replicate and tp)"
            )
        kinds = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}
        if schedule not in kinds:
            raise ConfigError(f"pipeline schedule {schedule!r} unknown (gpipe | 1f1b)")
        if microbatches < 1 or (schedule == "1f1b" and microbatches < dims.pp):
            raise ConfigError(
                f"pipeline microbatches: {microbatches} is too few for the {schedule!r} schedule "
                f"over {dims.pp} stages (1f1b needs at least one per stage)"
            )
        mesh = dims.build_mesh(next(model.parameters()).device.type)
        self.dims = dims
        self.group = mesh["pp"].get_group()
        self.rank, self.size = dims.coord("pp"), dims.pp
        self.module = make_stage(model, stage=self.rank, num_stages=self.size, grid=grid)
        parallelize_stage(
            self.module,
            dims,
            sequence_parallel=sequence_parallel,
            activation_checkpointing=activation_checkpointing,
            param_dtype=param_dtype,
            reduce_dtype=reduce_dtype,
        )
        device = next(model.parameters()).device
        self.stage = PipelineStage(self.module, self.rank, self.size, device, group=self.group)
        self.microbatches = microbatches
        loss_fn = _next_token if model.cfg.arch == "ar" else _mse
        self.schedule = kinds[schedule](self.stage, n_microbatches=microbatches, loss_fn=loss_fn)

    def step(self, edm, x0, text, *, sigma, noise) -> torch.Tensor | None:
        """Forward + backward of the EDM loss over the microbatches of this data-parallel rank's
        batch; returns its batch-mean loss on the last stage (None elsewhere). Call
        :func:`sync_pipeline_grads` afterwards."""
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
        return self._run((x_in, c_noise.to(x0.dtype), text.to(x0.dtype)), target)

    def step_tokens(self, tokens: torch.Tensor, text: torch.Tensor) -> torch.Tensor | None:
        """Forward + backward of the next-token loss of videos of ids (B, T, H, W) over the
        microbatches (the causal video transformer); batch-mean loss on the last stage."""
        ids = tokens.flatten(1)  # (B, N) targets
        bos = ids.new_full((ids.shape[0], 1), self.module.cfg.vocab_size)
        inputs = torch.cat([bos, ids[:, :-1]], dim=1)  # (B, N): BOS, then all but the last
        return self._run((inputs, text), ids)

    def _run(self, inputs: tuple, target: torch.Tensor) -> torch.Tensor | None:
        if target.shape[0] % self.microbatches:
            raise ValueError(
                f"batch of {target.shape[0]} samples cannot be split into {self.microbatches} "
                "microbatches"
            )
        losses: list = []
        if self.rank == 0:
            self.schedule.step(*inputs)
        elif self.rank == self.size - 1:
            self.schedule.step(target=target, losses=losses)
        else:
            self.schedule.step()
        if losses:
            return torch.stack([loss.detach() for loss in losses]).mean()
        return None


@torch.no_grad()
def sync_pipeline_grads(pipe: DiTPipeline) -> None:
    """Make the gradients final: TP partial sums (:func:`sync_grads`, SP / QK norms), then the
    per-stage conditioning replicas summed over the pipeline group (FSDP's reduce-scatter over dp
    ran inside the schedule); one coalesced all-reduce per group."""
    sync_grads(pipe.module)
    grads = [
        p.grad.to_local() if isinstance(p.grad, DTensor) else p.grad
        for name, p in pipe.module.named_parameters()
        if name.startswith(REPLICATED) and p.grad is not None
    ]
    if not grads:
        return
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat, group=pipe.group)
    offset = 0
    for g in grads:
        g.copy_(flat[offset : offset + g.numel()].view_as(g))
        offset += g.numel()
