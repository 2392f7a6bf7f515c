"""The training loop: a Stateful Trainer over a latent source, EDM loss on a DiT, honest MFU.

Stage order of one step (read top to bottom in :meth:`Trainer.train_step`):
sigma ~ log-normal, noise ~ N(0, I), captions dropped for CFG → EDM loss → backward → clip →
AdamW → LR schedule → EMA. Everything that changes during training (model, EMA, optimizer, schedule,
step, RNG, data position) is in :meth:`Trainer.state_dict` and goes through one checkpoint manager.
"""

from __future__ import annotations

import copy
import math
import resource
import time
from typing import Any

import torch
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_state_dict,
    set_state_dict,
)

from vfm_core.config import Config, ConfigError, OptimConfig, to_dict, validate
from vfm_core.data.samples import LatentBatch, LatentSource
from vfm_core.data.shard_source import make_source
from vfm_core.diffusion.edm import create_diffusion
from vfm_core.models.dit import build_model, count_params
from vfm_core.models.fp8 import drop_fp8_state, fp8_autocast, resolve_fp8, to_te_linears
from vfm_core.models.layers import set_attention_backend
from vfm_core.models.te_adapter import resolve_attention_backend
from vfm_core.perf.flops import train_flops_per_token
from vfm_core.perf.hardware import peak_flops


class TrainingDiverged(RuntimeError):
    """Loss or gradient norm became NaN/inf; raised before the optimizer touches the weights."""


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ConfigError("train.device: 'cuda' requested but no CUDA device is available")
    return torch.device(name)


def lr_lambda(optim: OptimConfig, total_steps: int):
    """Linear warm-up to the peak, then constant or cosine to ``min_lr_ratio`` at the horizon."""
    horizon = optim.decay_steps or total_steps

    def fn(step: int) -> float:
        if step < optim.warmup_steps:
            return (step + 1) / optim.warmup_steps
        if optim.schedule == "constant":
            return 1.0
        progress = min(1.0, (step - optim.warmup_steps) / max(1, horizon - optim.warmup_steps))
        return optim.min_lr_ratio + (1 - optim.min_lr_ratio) * 0.5 * (
            1 + math.cos(math.pi * progress)
        )

    return fn


def peak_memory_gb(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux -> GiB


class Trainer:
    """Single-process trainer (parallel layouts wrap the model from outside, issue #5)."""

    def __init__(self, cfg: Config, *, source: LatentSource | None = None, tp: int = 1):
        """``tp``: the tensor-parallel degree a parallel trainer splits this model by afterwards
        (FP8's transformer-engine linears cannot be split by DTensor plans)."""
        self.cfg = cfg = validate(cfg)
        p = cfg.parallel
        if (p.dp_replicate, p.cp, p.tp, p.pp) != (1, 1, 1, 1) or p.dp_shard not in (-1, 1):
            raise ConfigError(
                "parallel: only the single-process layout is available in this trainer "
                f"(got dp_replicate={p.dp_replicate} dp_shard={p.dp_shard} cp={p.cp} tp={p.tp} "
                f"pp={p.pp})"
            )
        self.device = resolve_device(cfg.train.device)
        backend, self.attn_backend_reason = resolve_attention_backend(cfg.model.attn_backend)
        set_attention_backend(backend)
        torch.manual_seed(cfg.train.seed)  # weight init is a function of the seed alone
        self.model = build_model(cfg.model, device=self.device)
        self.fp8, self.fp8_reason = resolve_fp8(cfg.train.fp8, tp=tp)
        if self.fp8:  # before the EMA copy and the optimizer: both see the TE linears
            to_te_linears(self.model)
        self.ema = copy.deepcopy(self.model).requires_grad_(False) if cfg.train.ema_decay else None
        o = cfg.optim
        self.optimizer = torch.optim.AdamW(
            self.model.parameters(), lr=o.lr, betas=o.betas, eps=o.eps, weight_decay=o.weight_decay
        )
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lr_lambda(o, cfg.train.steps)
        )
        self.edm = create_diffusion(cfg.diffusion)
        # sigma, noise and caption dropout: one stream, separate from init and data
        self.rng = torch.Generator(device=self.device).manual_seed(cfg.train.seed + 1)
        self.source = source or make_source(
            cfg.data, cfg.model, sigma_data=cfg.diffusion.sigma_data
        )  # data.source: synthetic blobs or shards
        self.step = 0
        d, m = cfg.data, cfg.model
        self.grid = (
            d.latent_frames // m.patch[0],
            d.latent_height // m.patch[1],
            d.latent_width // m.patch[2],
        )
        self.tokens_per_sample = math.prod(self.grid)
        self.flops_per_token = train_flops_per_token(
            m, seq_len=self.tokens_per_sample, grid=self.grid, text_len=m.text_len
        )
        self.peak_flops, self.peak_source = peak_flops(
            self.device.type, dtype=cfg.train.dtype, width=m.hidden
        )
        self.params = count_params(self.model)

    # ------------------------------------------------------------------ Stateful
    def state_dict(self) -> dict[str, Any]:
        model_sd, optim_sd = get_state_dict(self.model, self.optimizer)
        return {
            "model": drop_fp8_state(model_sd),
            "optim": optim_sd,
            "ema": drop_fp8_state(self.ema.state_dict()) if self.ema is not None else {},
            "sched": self.scheduler.state_dict(),
            "step": self.step,
            "rng": self.rng.get_state(),
            "data": self.source.state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        set_state_dict(
            self.model,
            self.optimizer,
            model_state_dict=state["model"],
            optim_state_dict=state["optim"],
            options=StateDictOptions(strict=not self.fp8),  # FP8: no TE scaling state saved
        )
        if self.ema is not None:
            self.ema.load_state_dict(state["ema"] or state["model"], strict=not self.fp8)
        self.scheduler.load_state_dict(state["sched"])
        self.step = int(state["step"])
        self.rng.set_state(state["rng"])
        self.source.load_state_dict(state["data"])

    def meta(self) -> dict[str, Any]:
        """What a checkpoint records besides state: the config (to refuse mismatched resumes)."""
        return {"model": to_dict(self.cfg.model), "recipe": self.cfg.recipe}

    # ------------------------------------------------------------------ one step
    def train_step(self, batch: LatentBatch) -> dict[str, float]:
        x0 = batch.latents.to(self.device, torch.float32)  # (B, C, T, H, W)
        b = x0.shape[0]
        sigma = self.edm.sample_sigma(b, generator=self.rng, device=self.device)  # (B,)
        noise = torch.randn(x0.shape, generator=self.rng, device=self.device)  # (B, C, T, H, W)
        keep = (
            torch.rand(b, generator=self.rng, device=self.device) >= self.cfg.diffusion.cond_dropout
        )
        text = batch.text.to(self.device) * keep[:, None, None]  # (B, L, Dt); dropped -> null text
        loss = self.loss(x0, text, sigma, noise)
        loss.backward()
        clip = self.cfg.optim.grad_clip or float("inf")
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), clip)
        lr = self.update(grad_norm)
        return {"loss": loss.item(), "grad_norm": grad_norm.item(), "lr": lr}

    def loss(self, x0: torch.Tensor, text: torch.Tensor, sigma: torch.Tensor,
             noise: torch.Tensor) -> torch.Tensor:  # fmt: skip
        """Mean EDM loss of the batch under the configured autocast; a non-finite loss stops
        training before any update."""
        dtype = torch.bfloat16 if self.cfg.train.dtype == "bfloat16" else torch.float32
        with (
            torch.autocast(self.device.type, dtype=dtype, enabled=dtype != torch.float32),
            fp8_autocast(self.fp8),
        ):
            loss = self.edm.loss(self.model, x0, text, sigma=sigma, noise=noise).mean()
        if not torch.isfinite(loss):
            raise TrainingDiverged(
                f"loss is {loss.item()} at step {self.step + 1}; stopped before the update, "
                "nothing was saved from this step (lower optim.lr or check the data)"
            )
        return loss

    def update(self, grad_norm: torch.Tensor) -> float:
        """Optimizer, LR schedule and EMA once the gradients are final (clipped to
        ``grad_norm``); a non-finite norm stops training before the update. Returns the LR."""
        if not torch.isfinite(grad_norm):
            self.optimizer.zero_grad(set_to_none=True)
            raise TrainingDiverged(
                f"gradient norm is {grad_norm.item()} at step {self.step + 1}; stopped before the "
                "update, nothing was saved from this step"
            )
        lr = self.scheduler.get_last_lr()[0]
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        if self.ema is not None:
            with torch.no_grad():
                for pe, pm in zip(self.ema.parameters(), self.model.parameters(), strict=True):
                    pe.lerp_(pm, 1 - self.cfg.train.ema_decay)
        self.step += 1
        return lr

    def metrics(
        self, step_out: dict[str, float], *, step_time: float, data_time: float, batch: int
    ) -> dict[str, float]:
        tokens_per_s = batch * self.tokens_per_sample / step_time
        achieved = tokens_per_s * self.flops_per_token  # FLOP/s
        return {
            **step_out,
            "tokens_per_s": tokens_per_s,
            "tflops": achieved / 1e12,
            "mfu": achieved / self.peak_flops,
            "data_wait": data_time / step_time,
            "step_time": step_time,
            "peak_mem_gb": peak_memory_gb(self.device),
        }

    # ------------------------------------------------------------------ loop
    def fit(self, *, loggers: list, checkpoint=None) -> dict[str, float]:
        """Train until ``train.steps``; log every ``log_every``; checkpoint every ``ckpt_every``
        and at the end. Returns the last logged metrics."""
        t = self.cfg.train
        last: dict[str, float] = {}
        while self.step < t.steps:
            t0 = time.perf_counter()
            batch = self.source.next_batch()
            t_data = time.perf_counter() - t0
            out = self.train_step(batch)
            dt = time.perf_counter() - t0
            if self.step % t.log_every == 0 or self.step == t.steps:
                last = self.metrics(
                    out, step_time=dt, data_time=t_data, batch=batch.latents.shape[0]
                )
                for lg in loggers:
                    lg.log(self.step, last)
            if checkpoint is not None and (self.step % t.ckpt_every == 0 or self.step == t.steps):
                checkpoint(self)
        return last
