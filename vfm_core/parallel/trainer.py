"""ParallelTrainer: the spine's Trainer with its model parallelized by ``parallelize_dit``.

Everything the single-process trainer does stays (EDM loss, AdamW, LR schedule, EMA, metrics); what
changes per step, in order: this rank takes its data-parallel slice of the global batch -> sigma,
noise and caption drop come from the counter-based :class:`StepRNG` (same numbers in every layout)
-> loss -> backward -> :func:`sync_grads` (CP / SP partial sums) -> global gradient-norm clip over
all meshes -> AdamW -> the logged loss is the global-batch mean over the data-parallel ranks.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor, Shard

from vfm_core.config import Config, ParallelConfig
from vfm_core.data.samples import LatentBatch, LatentSource
from vfm_core.data.synthetic_latents import SyntheticLatents
from vfm_core.parallel.dims import ParallelDims
from vfm_core.parallel.parallelize import parallelize_dit, sync_grads
from vfm_core.parallel.rng import StepRNG
from vfm_core.train.trainer import Trainer, lr_lambda


@torch.no_grad()
def clip_grad_norm(model: nn.Module, max_norm: float) -> torch.Tensor:
    """Global L2 norm of all gradients of a parallelized model, then scale them to ``max_norm``.

    Gradients may be plain (replicated on every rank) or DTensors on different meshes (FSDP, TP,
    both). Each rank sums the squares of its local pieces weighted by 1 / (number of ranks holding
    that same piece) and one all-reduce over the world adds them up, so every element counts once.
    """
    world = dist.get_world_size()
    total = torch.zeros((), dtype=torch.float64)
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    for g in grads:
        if isinstance(g, DTensor):
            shards = 1
            for i, pl in enumerate(g.placements):
                if isinstance(pl, Shard):
                    shards *= g.device_mesh.size(i)
            local = g.to_local()
        else:
            shards, local = 1, g
        total += local.double().square().sum().cpu() * shards / world
    device = grads[0].device if grads else torch.device("cpu")
    total = total.to(device)
    dist.all_reduce(total)
    norm = total.sqrt()
    coef = (max_norm / (norm + 1e-6)).clamp(max=1.0)
    if torch.isfinite(norm):
        for g in grads:
            (g.to_local() if isinstance(g, DTensor) else g).mul_(coef.to(g.dtype))
    return norm.float()


class ParallelTrainer(Trainer):
    """Trainer whose model (and EMA) is parallelized over ``dims``; the source yields the global
    batch (``data.batch_size`` per data-parallel rank times ``dims.dp``)."""

    def __init__(self, cfg: Config, *, dims: ParallelDims, source: LatentSource | None = None):
        p = cfg.parallel
        single = dataclasses.replace(cfg, parallel=ParallelConfig())
        global_data = dataclasses.replace(cfg.data, batch_size=cfg.data.batch_size * dims.dp)
        source = source or SyntheticLatents(
            global_data, cfg.model, sigma_data=cfg.diffusion.sigma_data
        )
        super().__init__(single, source=source)  # same seed on every rank: identical full init
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
        o = cfg.optim
        # foreach=False: parameters live on different meshes (FSDP, TP) or none
        self.optimizer = torch.optim.AdamW(
            self.model.parameters(),
            lr=o.lr,
            betas=o.betas,
            eps=o.eps,
            weight_decay=o.weight_decay,
            foreach=False,
        )
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lr_lambda(o, cfg.train.steps)
        )
        self.step_rng = StepRNG.from_dims(cfg.train.seed + 1, dims)
        self.world = dist.get_world_size()

    def train_step(self, batch: LatentBatch) -> dict[str, float]:
        b = self.cfg.data.batch_size
        sl = slice(self.dims.dp_rank() * b, (self.dims.dp_rank() + 1) * b)
        x0 = batch.latents[sl].to(self.device, torch.float32)  # (b, C, T, H, W)
        d = self.cfg.diffusion
        sigma = self.step_rng.sigma(self.step, b, p_mean=d.p_mean, p_std=d.p_std)  # (b,)
        sigma = sigma.to(self.device, torch.float32)
        # all frames: CP ranks split the tokens inside the model, the loss sees the full latent
        noise = self.step_rng.noise(self.step, tuple(x0.shape)).to(self.device)  # (b, C, T, H, W)
        keep = self.step_rng.keep_caption(self.step, b, d.cond_dropout).to(self.device)  # (b,)
        text = batch.text[sl].to(self.device) * keep[:, None, None]  # (b, L, Dt)
        loss = self.loss(x0, text, sigma, noise)
        loss.backward()
        sync_grads(self.model)
        grad_norm = clip_grad_norm(self.model, self.cfg.optim.grad_clip or float("inf"))
        lr = self.update(grad_norm)
        total = loss.detach().float().clone()
        dist.all_reduce(total)  # equal within a model-parallel group: mean over ranks = global
        return {"loss": total.item() / self.world, "grad_norm": grad_norm.item(), "lr": lr}

    def metrics(self, step_out, *, step_time, data_time, batch):
        """``batch`` is the global batch: throughput is global, TFLOPS and MFU are per GPU."""
        out = super().metrics(step_out, step_time=step_time, data_time=data_time, batch=batch)
        out["tflops"] /= self.world
        out["mfu"] /= self.world
        return out

    def meta(self):
        return {**super().meta(), "parallel": dataclasses.asdict(self.cfg.parallel)}
