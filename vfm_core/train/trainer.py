"""The training loop: a Stateful Trainer over a latent source, EDM loss on a DiT, honest MFU.

Stage order of one step (read top to bottom in :meth:`Trainer.train_step`):
sigma ~ log-normal, noise ~ N(0, I), captions dropped for CFG → EDM loss → backward → clip →
AdamW → LR schedule → EMA. Everything that changes during training (model, EMA, optimizer, schedule,
step, RNG, data position) is in :meth:`Trainer.state_dict` and goes through one checkpoint manager.

Packed steps (``data.max_tokens > 0``, :meth:`Trainer.train_packed`): per sample of the step, in
order, sigma, noise of its own latent shape and the caption drop come from the same RNG → per
pack: pack latents and noise → ``forward_packed`` + :func:`packed_loss` (S,) → backward of its
sum / samples of the step, so the step's loss is the mean over samples → clip → update. Tokens/s
and MFU count the real (unpadded) tokens and every sample's FLOPs at its own length.
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
from vfm_core.data.samples import LatentBatch, LatentPack, LatentSource, PackedLatentBatch
from vfm_core.data.shard_source import make_source
from vfm_core.diffusion.edm import create_diffusion
from vfm_core.diffusion.packed import packed_loss
from vfm_core.models.dit import build_model, count_params
from vfm_core.models.fp8 import drop_fp8_state, fp8_autocast, resolve_fp8, to_te_linears
from vfm_core.models.layers import set_attention_backend
from vfm_core.models.packed import pack_latents
from vfm_core.models.te_adapter import resolve_attention_backend
from vfm_core.perf.flops import train_flops, train_flops_per_token
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


def build_optimizer(
    model: torch.nn.Module, o: OptimConfig, total_steps: int, *, foreach: bool | None = None
) -> tuple[torch.optim.AdamW, torch.optim.lr_scheduler.LambdaLR]:
    """AdamW over ``model``'s parameters and its warm-up / decay schedule. Parallel trainers pass
    ``foreach=False``: their parameters live on different meshes (FSDP, TP) or none."""
    opt = torch.optim.AdamW(model.parameters(), lr=o.lr, betas=o.betas, eps=o.eps,
                            weight_decay=o.weight_decay, foreach=foreach)  # fmt: skip
    return opt, torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda(o, total_steps))


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
        self.optimizer, self.scheduler = build_optimizer(self.model, cfg.optim, cfg.train.steps)
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
        self.packed_work: tuple[float, float] | None = None
        """Packed runs: (real tokens, training FLOPs) of the last step, for its metrics."""

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
    def train_step(self, batch: LatentBatch | PackedLatentBatch) -> dict[str, float]:
        if isinstance(batch, PackedLatentBatch):
            return self.train_packed(batch)
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

    def autocast(self):
        """The configured forward precision (bf16 autocast, FP8 GEMMs)."""
        dtype = torch.bfloat16 if self.cfg.train.dtype == "bfloat16" else torch.float32
        return (
            torch.autocast(self.device.type, dtype=dtype, enabled=dtype != torch.float32),
            fp8_autocast(self.fp8),
        )

    def check_finite(self, loss: torch.Tensor) -> None:
        if not torch.isfinite(loss):
            self.optimizer.zero_grad(set_to_none=True)
            raise TrainingDiverged(
                f"loss is {loss.item()} at step {self.step + 1}; stopped before the update, "
                "nothing was saved from this step (lower optim.lr or check the data)"
            )

    def loss(self, x0: torch.Tensor, text: torch.Tensor, sigma: torch.Tensor,
             noise: torch.Tensor) -> torch.Tensor:  # fmt: skip
        """Mean EDM loss of the batch under the configured autocast; a non-finite loss stops
        training before any update."""
        cast, fp8 = self.autocast()
        with cast, fp8:
            loss = self.edm.loss(self.model, x0, text, sigma=sigma, noise=noise).mean()
        self.check_finite(loss)
        return loss

    # ------------------------------------------------------------------ packed step
    def pack_draws(self, batch: PackedLatentBatch) -> list[tuple[torch.Tensor, list, torch.Tensor]]:
        """Per pack: sigma (S,), noise [(C, T_s, H_s, W_s)] and caption keep (S,), drawn from the
        trainer's RNG for the samples of the step in order (the RNG state makes resume exact)."""
        n = batch.n_samples
        sigma = self.edm.sample_sigma(n, generator=self.rng, device=self.device)  # (n,)
        noise = [
            torch.randn(z.shape, generator=self.rng, device=self.device)  # (C, T, H, W)
            for p in batch.packs
            for z in p.latents
        ]
        keep = (
            torch.rand(n, generator=self.rng, device=self.device) >= self.cfg.diffusion.cond_dropout
        )
        out, a = [], 0
        for p in batch.packs:
            b = a + len(p.keys)
            out.append((sigma[a:b], noise[a:b], keep[a:b]))
            a = b
        return out

    def pack_weight(self, batch: PackedLatentBatch) -> float:
        """Factor on the sum of a step's per-sample losses: 1 / samples (the step mean). Also sets
        :attr:`packed_work` (real tokens, FLOPs) of the step."""
        self.packed_work = self.pack_work(batch)
        return 1.0 / batch.n_samples

    def pack_work(self, batch: PackedLatentBatch) -> tuple[float, float]:
        """(unpadded tokens, training FLOPs) of this batch: every sample at its own length."""
        tokens = flops = 0.0
        m, patch = self.cfg.model, self.cfg.model.patch
        for p in batch.packs:
            grids = [tuple(s // q for s, q in zip(z.shape[1:], patch)) for z in p.latents]
            lens = [g[0] * g[1] * g[2] for g in grids]
            tokens += sum(lens)
            flops += train_flops(m, seq_lens=lens, grid=grids, text_len=m.text_len)["total"]
        return tokens, flops

    def pack_loss(self, pack: LatentPack, sigma: torch.Tensor, noise: list,
                  keep: torch.Tensor) -> torch.Tensor:  # fmt: skip
        """Per-sample EDM loss (S,) of one pack through ``forward_packed``."""
        patch, dev = self.cfg.model.patch, self.device
        x0, layout = pack_latents(
            [z.to(dev, torch.float32) for z in pack.latents], patch, pack.length
        )  # (N, C*P) fmt: skip
        noise_tok, _ = pack_latents(noise, patch, pack.length)  # (N, C*P)
        text = pack.text.to(dev) * keep[:, None, None]  # (S, L, Dt); dropped -> null text
        lengths = pack.text_lengths.to(dev)  # (S,)

        def net(x, c_noise, txt):
            return self.model.forward_packed(x, c_noise, txt, lengths, layout)  # (N, C*P)

        cast, fp8 = self.autocast()
        with cast, fp8:
            return packed_loss(self.edm, net, x0, text, sigma=sigma.to(dev, torch.float32),
                               noise=noise_tok, sample_ids=layout.sample_ids.to(dev))  # fmt: skip

    def packed_backward(self, batch: PackedLatentBatch) -> torch.Tensor:
        """Forward + backward of every pack of the step; returns the weighted loss sum (the
        step's mean over samples in one process)."""
        weight = self.pack_weight(batch)
        total = torch.zeros((), dtype=torch.float64, device=self.device)
        for pack, (sigma, noise, keep) in zip(batch.packs, self.pack_draws(batch), strict=True):
            loss = self.pack_loss(pack, sigma, noise, keep).sum() * weight
            self.check_finite(loss)
            loss.backward()
            total += loss.detach().double()
        return total

    def train_packed(self, batch: PackedLatentBatch) -> dict[str, float]:
        """One step on packs (module docstring)."""
        loss = self.packed_backward(batch)
        clip = self.cfg.optim.grad_clip or float("inf")
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), clip)
        lr = self.update(grad_norm)
        return {"loss": loss.item(), "grad_norm": grad_norm.item(), "lr": lr}

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
        if self.packed_work is not None:  # packs: real tokens, every sample's own FLOPs
            tokens_per_s = self.packed_work[0] / step_time
            achieved = self.packed_work[1] / step_time  # FLOP/s
        else:
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
                n = batch.n_samples if isinstance(batch, PackedLatentBatch) else len(batch.latents)
                last = self.metrics(out, step_time=dt, data_time=t_data, batch=n)
                for lg in loggers:
                    lg.log(self.step, last)
            if checkpoint is not None and (self.step % t.ckpt_every == 0 or self.step == t.steps):
                checkpoint(self)
        return last
