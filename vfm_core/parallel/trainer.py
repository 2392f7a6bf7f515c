"""ParallelTrainer: the spine's Trainer with its model parallelized by ``parallelize_dit``.

Everything the single-process trainer does stays (EDM loss, AdamW, LR schedule, EMA, metrics); what
changes per step, in order: this rank takes its data-parallel slice of the global batch (with
``data.source: shards`` the loader hands each data-parallel rank its own slice, read 1/k per
model-parallel rank and all-gathered: :func:`shard_source_for`) -> sigma,
noise and caption drop come from the counter-based :class:`StepRNG` (same numbers in every layout)
-> loss -> backward -> :func:`sync_grads` (CP / SP partial sums) -> global gradient-norm clip over
all meshes -> AdamW -> the logged loss is the global-batch mean over the data-parallel ranks.

Packed steps (``data.max_tokens > 0``): each data-parallel rank trains its own packs (every rank
of a model-parallel group the same ones; CP / TP cut each pack's tokens inside the model). Sigma,
noise and caption drop of a sample are counter-based on (step, its global loader position), so
every layout draws the same numbers for it; one all-reduce of the step's sample count makes every
rank weigh its per-sample losses by dp / (samples of the global step), so the data-parallel
gradient average is the mean over all samples of the global step.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor, Shard

from vfm_core.config import Config, ParallelConfig, validate
from vfm_core.data.samples import LatentBatch, LatentSource, PackedLatentBatch
from vfm_core.data.shard_source import ShardLatentSource
from vfm_core.data.synthetic_latents import SyntheticLatents
from vfm_core.parallel.dims import ParallelDims
from vfm_core.parallel.parallelize import parallelize_dit, sync_grads
from vfm_core.parallel.rng import StepRNG, counter_generator
from vfm_core.train.trainer import Trainer, build_optimizer

log = logging.getLogger(__name__)


def model_parallel_group(dims: ParallelDims) -> dist.ProcessGroup | None:
    """The ranks that hold the same data-parallel slice (pp x cp x tp), as a gloo group (the
    loader all-gathers bytes in CPU tensors, also under nccl); None when that is one rank.

    ``dist.new_group`` must be entered by every rank for every group in the same order, so all
    dp groups are created here and this rank keeps its own.
    """
    if dims.pp * dims.cp * dims.tp == 1:
        return None
    ranks = dims.mesh.mesh  # (pp, dp_replicate, dp_shard, cp, tp) global ranks
    mine = None
    for r in range(dims.dp_replicate):
        for s in range(dims.dp_shard):
            members = sorted(ranks[:, r, s].flatten().tolist())
            group = dist.new_group(members, backend="gloo")
            if dist.get_rank() in members:
                mine = group
    return mine


def shard_source_for(cfg: Config, dims: ParallelDims) -> ShardLatentSource:
    """This rank's shard source: ``data.batch_size`` samples of data-parallel slice
    ``dims.dp_rank()`` per step. The loader plans every step globally and rank r takes batch r
    of it, so the slices of all dp ranks, in dp order, are the global batch a 1-process run with
    ``data.batch_size * dp`` reads at that step (same samples, same order)."""
    return ShardLatentSource(
        cfg.data,
        cfg.model,
        dp_rank=dims.dp_rank(),
        dp_size=dims.dp,
        mp_group=model_parallel_group(dims),
    )


@torch.no_grad()
def clip_grad_norm(
    model: nn.Module, max_norm: float, *, holders: Callable[[str], int] | None = None
) -> torch.Tensor:
    """Global L2 norm of all gradients of a parallelized model, then scale them to ``max_norm``.

    Gradients may be plain (replicated on every rank) or DTensors on different meshes (FSDP, TP,
    both). Each rank sums the squares of its local pieces weighted by 1 / (number of ranks holding
    that same piece) and one all-reduce over the world adds them up, so every element counts once.
    A piece is held by ``world / shards`` ranks, divided further by ``holders(name)`` where the
    model is itself one of several disjoint parts (pipeline stages: ``pp`` for a stage's own
    parameters, 1 for conditioning replicas present on every stage).
    """
    world = dist.get_world_size()
    total = torch.zeros((), dtype=torch.float64)
    grads = []
    for name, p in model.named_parameters():
        g = p.grad
        if g is None:
            continue
        grads.append(g)
        shards = 1
        if isinstance(g, DTensor):
            for i, pl in enumerate(g.placements):
                if isinstance(pl, Shard):
                    shards *= g.device_mesh.size(i)
            g = g.to_local()
        parts = holders(name) if holders is not None else 1
        total += g.double().square().sum().cpu() * shards * parts / world
    device = grads[0].device if grads else torch.device("cpu")
    total = total.to(device)
    dist.all_reduce(total)
    norm = total.sqrt()
    coef = (max_norm / (norm + 1e-6)).clamp(max=1.0)
    if torch.isfinite(norm):
        for g in grads:
            (g.to_local() if isinstance(g, DTensor) else g).mul_(coef.to(g.dtype))
    return norm.float()


def trainer_source(
    cfg: Config, dims: ParallelDims, source: LatentSource | None
) -> tuple[LatentSource, bool]:
    """(source, local_batches) of a parallel trainer: ``data.source: shards`` gives this rank its
    data-parallel slice directly (local batches); a given source and the synthetic one yield the
    global batch (``data.batch_size`` per data-parallel rank times ``dims.dp``) to be sliced."""
    if source is None and cfg.data.source == "shards":
        return shard_source_for(cfg, dims), True
    if source is None:
        global_data = dataclasses.replace(cfg.data, batch_size=cfg.data.batch_size * dims.dp)
        source = SyntheticLatents(global_data, cfg.model, sigma_data=cfg.diffusion.sigma_data)
    return source, False


class GlobalMetrics:
    """Metrics of a parallel trainer (mixed in before :class:`Trainer`): ``batch`` is the
    source's batch (this rank's with shards: times dp for the global one; packs: the global
    step's real tokens and FLOPs): throughput is global, TFLOPS and MFU are per GPU."""

    def metrics(self, step_out, *, step_time, data_time, batch):
        if self.local_batches:
            batch *= self.dims.dp
        out = super().metrics(step_out, step_time=step_time, data_time=data_time, batch=batch)
        out["tflops"] /= self.world
        out["mfu"] /= self.world
        return out


class ParallelTrainer(GlobalMetrics, Trainer):
    """Trainer whose model (and EMA) is parallelized over ``dims``. A given ``source`` and the
    synthetic one yield the global batch (``data.batch_size`` per data-parallel rank times
    ``dims.dp``) and each rank slices its part; ``data.source: shards`` yields this rank's slice
    directly (``local_batches``)."""

    def __init__(self, cfg: Config, *, dims: ParallelDims, source: LatentSource | None = None):
        p = validate(cfg).parallel  # the layout-dependent checks (e.g. data.max_tokens vs cp*tp)
        single = dataclasses.replace(cfg, parallel=ParallelConfig())
        source, self.local_batches = trainer_source(cfg, dims, source)
        # same seed on every rank: identical full init
        super().__init__(single, source=source, tp=dims.tp)
        self.cfg, self.dims = cfg, dims
        bf16 = cfg.train.dtype == "bfloat16" and self.device.type == "cuda"
        opts = dict(
            parallel_dims=dims,
            sequence_parallel=p.sequence_parallel,
            cp_mode=p.cp_mode,
            activation_checkpointing=p.activation_checkpointing,
            param_dtype=torch.bfloat16 if bf16 else None,
            reduce_dtype=torch.float32 if bf16 else None,
        )
        if self.ema is not None:
            self.ema = parallelize_dit(self.ema, **{**opts, "activation_checkpointing": False})
        self.model = parallelize_dit(self.model, **opts)
        self.optimizer, self.scheduler = build_optimizer(
            self.model, cfg.optim, cfg.train.steps, foreach=False
        )
        self.step_rng = StepRNG.from_dims(cfg.train.seed + 1, dims)
        self.world = dist.get_world_size()

    def local_batch(self, batch: LatentBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """This rank's (latents, text): its slice of a global batch, or the batch itself when the
        source already gives per-rank batches (shards)."""
        if self.local_batches:
            return batch.latents, batch.text
        b = self.cfg.data.batch_size
        sl = slice(self.dims.dp_rank() * b, (self.dims.dp_rank() + 1) * b)
        return batch.latents[sl], batch.text[sl]

    def train_step(self, batch: LatentBatch | PackedLatentBatch) -> dict[str, float]:
        if isinstance(batch, PackedLatentBatch):
            return self.train_packed(batch)
        b = self.cfg.data.batch_size
        latents, text = self.local_batch(batch)
        x0 = latents.to(self.device, torch.float32)  # (n, C, T, H, W)
        n = x0.shape[0]
        if n != b:  # the loader skipped bad samples: draws of the first n of this rank's b
            log.warning("step %d: %d of %d samples on dp rank %d", self.step + 1, n, b,
                        self.dims.dp_rank())  # fmt: skip
        d = self.cfg.diffusion
        sigma = self.step_rng.sigma(self.step, b, p_mean=d.p_mean, p_std=d.p_std)[:n]  # (n,)
        sigma = sigma.to(self.device, torch.float32)
        # all frames: CP ranks split the tokens inside the model, the loss sees the full latent
        noise = self.step_rng.noise(self.step, (b, *x0.shape[1:]))[:n]  # (n, C, T, H, W)
        noise = noise.to(self.device)
        keep = self.step_rng.keep_caption(self.step, b, d.cond_dropout)[:n]  # (n,)
        keep = keep.to(self.device)
        text = text.to(self.device) * keep[:, None, None]  # (n, L, Dt)
        loss = self.loss(x0, text, sigma, noise)
        loss.backward()
        sync_grads(self.model)
        grad_norm = clip_grad_norm(self.model, self.cfg.optim.grad_clip or float("inf"))
        lr = self.update(grad_norm)
        total = loss.detach().float().clone()
        dist.all_reduce(total)  # equal within a model-parallel group: mean over ranks = global
        return {"loss": total.item() / self.world, "grad_norm": grad_norm.item(), "lr": lr}

    # ------------------------------------------------------------------ packed step
    def pack_draws(self, batch: PackedLatentBatch) -> list[tuple[torch.Tensor, list, torch.Tensor]]:
        """Per pack: sigma (S,), noise [(C, T_s, H_s, W_s)], caption keep (S,), each a function of
        (train seed, step, the sample's loader position) only: the same in every layout."""
        d, seed, dev = self.cfg.diffusion, self.step_rng.seed, self.device
        out = []
        for p in batch.packs:
            gens = {
                what: [counter_generator(seed, what, self.step, pos) for pos in p.positions]
                for what in ("sigma", "noise", "keep")
            }
            n = torch.cat(
                [torch.randn(1, generator=g, dtype=torch.float64) for g in gens["sigma"]]
            )  # (S,) fmt: skip
            u = torch.cat(
                [torch.rand(1, generator=g, dtype=torch.float64) for g in gens["keep"]]
            )  # (S,) fmt: skip
            noise = [
                torch.randn(z.shape, generator=g).to(dev)  # (C, T, H, W)
                for z, g in zip(p.latents, gens["noise"], strict=True)
            ]
            sigma = (d.p_mean + d.p_std * n).exp()  # (S,)
            out.append((sigma.to(dev), noise, (u >= d.cond_dropout).to(dev)))
        return out

    def pack_weight(self, batch: PackedLatentBatch) -> float:
        """dp / (samples of the global step): the data-parallel gradient average then is the
        mean over all its samples. Sets :attr:`packed_work` to the global step's (tokens, FLOPs)."""
        tokens, flops = self.pack_work(batch)
        counts = torch.tensor([batch.n_samples, tokens, flops], dtype=torch.float64)
        counts = counts.to(self.device)
        dist.all_reduce(counts)  # every dp slice counted once per rank of its model-parallel group
        counts = (counts / (self.world // self.dims.dp)).tolist()
        self.packed_work = (counts[1], counts[2])
        return self.dims.dp / counts[0]

    def train_packed(self, batch: PackedLatentBatch) -> dict[str, float]:
        loss = self.packed_backward(batch)
        sync_grads(self.model)
        grad_norm = clip_grad_norm(self.model, self.cfg.optim.grad_clip or float("inf"))
        lr = self.update(grad_norm)
        total = loss.detach().float().clone()
        dist.all_reduce(total)  # equal within a model-parallel group: sum / world = global mean
        return {"loss": total.item() / self.world, "grad_norm": grad_norm.item(), "lr": lr}

    def state_dict(self) -> dict[str, Any]:
        """As the spine's, after checking that every rank holds the same data state: the loader
        plans globally, so one copy (rank 0 writes it) restores every dp rank."""
        state = super().state_dict()
        raw = json.dumps(state["data"], sort_keys=True).encode()
        digest = int.from_bytes(hashlib.blake2b(raw, digest_size=7).digest(), "little")
        both = torch.tensor([digest, -digest], dtype=torch.int64)
        if dist.get_backend() == "nccl":
            both = both.cuda()
        dist.all_reduce(both, op=dist.ReduceOp.MAX)
        if int(both[0]) != digest or int(both[1]) != -digest:
            raise RuntimeError(
                f"data state differs across ranks at step {self.step} (rank {dist.get_rank()}); "
                "one copy could not restore them all"
            )
        return state

    def meta(self):
        return {**super().meta(), "parallel": dataclasses.asdict(self.cfg.parallel)}
