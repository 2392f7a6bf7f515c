"""The one trainer: every parallel layout and one process alike, one loop, one RNG scheme.

A run is a config; the layout (``parallel.*``) is data. One process is the world-size-1 case of
the same code: :func:`~vfm_core.parallel.world.init_world` gives it a one-rank process group, the
layout is applied from outside (:func:`~vfm_core.parallel.apply.apply_layout`), and every
collective below is an identity over one rank. ``data.batch_size`` is the global batch, so
``vfm train`` and ``vfm train --nproc N --tp/--cp/--pp/--dp-shard ...`` train on the same samples
with the same draws and give the same loss at every step.

One step, in order (:meth:`Trainer.train_step`):

1. this rank's data-parallel slice of the global batch (``batch_size / dp`` samples; the shard
   loader hands it out directly, read 1/k per model-parallel rank and all-gathered);
2. sigma, noise and caption drop: counter-based draws keyed by (seed, step, global sample
   position) (:mod:`vfm_core.parallel.rng`, paper Table 3): the same numbers in every layout;
3. forward + backward of the EDM loss: the whole model (TP/SP, CP, FSDP2 inside), or the 1F1B
   pipeline schedule over ``pp`` microbatches;
4. gradients made final (TP/SP partial sums, pipeline conditioning replicas);
5. the logged loss is the global-batch mean; a non-finite one stops before any update;
6. global gradient-norm clip over all meshes → AdamW → LR schedule → EMA.

Packed steps (``data.max_tokens > 0``): each data-parallel rank trains its own packs; per sample,
sigma / noise / caption drop are keyed by (step, its loader position); one all-reduce of the
step's sample count weighs every per-sample loss by dp / (samples of the global step), so the
data-parallel gradient average is the mean over all samples. Tokens/s and MFU count real tokens.

Everything that changes during training (model, EMA, optimizer, schedule, step, data position)
is in :meth:`Trainer.state_dict`; the draws need no state (they are functions of the step).
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import hashlib
import json
import logging
import math
import resource
import time
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.parallel import loss_parallel

from vfm_core.config import Config, ConfigError, OptimConfig, to_dict
from vfm_core.data.packing import PackLayout
from vfm_core.data.samples import LatentBatch, LatentPack, LatentSource, PackedLatentBatch
from vfm_core.data.shard_source import make_source
from vfm_core.diffusion.edm import create_diffusion
from vfm_core.diffusion.packed import packed_loss
from vfm_core.models.ar import next_token_loss, packed_next_token_loss
from vfm_core.models.dit import build_model, count_params
from vfm_core.models.fp8 import drop_fp8_state, fp8_autocast, resolve_fp8, to_te_linears
from vfm_core.models.layers import set_attention_backend
from vfm_core.models.packed import pack_latents
from vfm_core.models.te_adapter import resolve_attention_backend
from vfm_core.parallel.apply import apply_layout
from vfm_core.parallel.dims import ParallelDims
from vfm_core.parallel.layout import validate_layout
from vfm_core.parallel.rng import StepRNG, counter_generator
from vfm_core.parallel.world import init_world
from vfm_core.perf.flops import train_flops, train_flops_per_token
from vfm_core.perf.hardware import peak_flops, recheck_cpu_peak
from vfm_core.train.errors import TrainingDiverged

__all__ = ["Trainer", "TrainingDiverged", "build_optimizer", "lr_lambda", "resolve_device"]

log = logging.getLogger(__name__)


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
    model: torch.nn.Module, o: OptimConfig, total_steps: int
) -> tuple[torch.optim.AdamW, torch.optim.lr_scheduler.LambdaLR]:
    """AdamW over ``model``'s parameters and its warm-up / decay schedule (not ``foreach``: the
    parameters may live on different meshes, FSDP and TP, or none; same math either way)."""
    opt = torch.optim.AdamW(model.parameters(), lr=o.lr, betas=o.betas, eps=o.eps,
                            weight_decay=o.weight_decay, foreach=False)  # fmt: skip
    return opt, torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda(o, total_steps))


def peak_memory_gb(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux -> GiB


def training_source(cfg: Config, dims: ParallelDims) -> tuple[LatentSource, bool]:
    """(source, local): ``data.source: shards`` yields this rank's data-parallel slice directly
    (``batch_size / dp`` samples; the model-parallel ranks of a slice each read 1/k and
    all-gather). The synthetic source yields the global batch; each rank slices its part."""
    sigma_data = cfg.diffusion.sigma_data
    if cfg.data.source != "shards":
        return make_source(cfg.data, cfg.model, sigma_data=sigma_data), False
    local = dataclasses.replace(cfg.data, batch_size=cfg.data.batch_size // dims.dp)
    src = make_source(local, cfg.model, sigma_data=sigma_data, dp_rank=dims.dp_rank(),
                      dp_size=dims.dp, mp_group=dims.model_parallel_group())  # fmt: skip
    return src, True


class Trainer:
    """Trains ``cfg`` on this rank's part of its layout (module docstring). ``source``: a latent
    source yielding the global batch (tests); default from ``data.source``."""

    def __init__(self, cfg: Config, *, source: LatentSource | None = None):
        self.device = resolve_device(cfg.train.device)
        init_world(self.device)
        self.world = dist.get_world_size()
        self.dims = dims = validate_layout(cfg, self.world)
        dims.build_mesh(self.device.type)
        self.cfg = cfg
        self.autoregressive = cfg.model.arch == "ar"
        """The autoregressive family: token ids, next-token loss (no sigma / noise draws)."""
        backend, self.attn_backend_reason = resolve_attention_backend(cfg.model.attn_backend)
        set_attention_backend(backend)
        torch.manual_seed(cfg.train.seed)  # weight init: a function of the seed, same every rank
        model = build_model(cfg.model, device=self.device)
        self.fp8, self.fp8_reason = resolve_fp8(cfg.train.fp8, tp=dims.tp)
        if self.fp8:  # before the EMA copy and the optimizer: both see the TE linears
            to_te_linears(model)
        ema = copy.deepcopy(model).requires_grad_(False) if cfg.train.ema_decay else None
        self.params = count_params(model)
        d, m = cfg.data, cfg.model
        self.grid = (d.latent_frames // m.patch[0], d.latent_height // m.patch[1],
                     d.latent_width // m.patch[2])  # fmt: skip
        self.tokens_per_sample = math.prod(self.grid)
        self.flops_per_token = train_flops_per_token(
            m, seq_len=self.tokens_per_sample, grid=self.grid, text_len=m.text_len
        )
        self.peak_rechecked = False
        self.peak_flops, self.peak_source = peak_flops(
            self.device.type, dtype=cfg.train.dtype, width=m.hidden
        )
        self.local_batch_size = d.batch_size // dims.dp
        if source is not None:
            self.source, self.local_batches = source, False
        else:
            self.source, self.local_batches = training_source(cfg, dims)
        null = getattr(self.source, "null_text", None)  # (L, Dt) empty caption, None: zeros
        self.null_text = (torch.zeros(m.text_len, m.text_dim) if null is None else null).to(
            self.device
        )
        self.null_length = int(getattr(self.source, "null_length", 1))
        self.layout = apply_layout(model, ema, cfg=cfg, dims=dims, grid=self.grid)
        self.model, self.ema = self.layout.model, self.layout.ema
        self.optimizer, self.scheduler = build_optimizer(self.model, cfg.optim, cfg.train.steps)
        self.edm = create_diffusion(cfg.diffusion)
        self.draws = StepRNG.from_dims(cfg.train.seed + 1, dims)
        self.step = 0
        self.packed_work: tuple[float, float] | None = None
        """Packed runs: (real tokens, training FLOPs) of the global step, for its metrics."""

    # ------------------------------------------------------------------ Stateful
    def state_dict(self) -> dict[str, Any]:
        model_sd, optim_sd = get_state_dict(self.model, self.optimizer)
        state = {
            "model": drop_fp8_state(model_sd),
            "optim": optim_sd,
            "ema": drop_fp8_state(self.ema.state_dict()) if self.ema is not None else {},
            "sched": self.scheduler.state_dict(),
            "step": self.step,
            "data": self.source.state_dict(),
        }
        self._check_same_data_state(state["data"])
        return state

    def _check_same_data_state(self, data: dict[str, Any]) -> None:
        """The loader plans globally, so every rank holds the same data state and one copy
        restores them all; check that before a checkpoint records it."""
        if self.world == 1:
            return
        raw = json.dumps(data, sort_keys=True).encode()
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
        self.source.load_state_dict(state["data"])

    def meta(self) -> dict[str, Any]:
        """What a checkpoint records besides state: the model config (to refuse mismatched
        resumes), the recipe and the layout it was saved under."""
        return {"model": to_dict(self.cfg.model), "recipe": self.cfg.recipe,
                "parallel": dataclasses.asdict(self.cfg.parallel)}  # fmt: skip

    # ------------------------------------------------------------------ one step
    def train_step(self, batch: LatentBatch | PackedLatentBatch) -> dict[str, float]:
        if isinstance(batch, PackedLatentBatch):
            return self.train_packed(batch)
        b = self.local_batch_size
        data, text = self.local_slice(batch)  # latents (n, C, T, H, W) | token ids (n, T, H, W)
        n = data.shape[0]
        if n != b:  # the loader skipped bad samples: draws of the first n of this rank's b
            if self.layout.pipe is not None:
                raise ValueError(
                    f"step {self.step + 1}: the loader gave {n} of {b} samples on data-parallel "
                    f"rank {self.dims.dp_rank()}; the pipeline schedule needs full batches "
                    "(remove the bad samples from the shards)"
                )
            log.warning("step %d: %d of %d samples on dp rank %d", self.step + 1, n, b,
                        self.dims.dp_rank())  # fmt: skip
        d = self.cfg.diffusion
        keep = self.draws.keep_caption(self.step, b, d.cond_dropout)[:n].to(self.device)  # (n,)
        text = self.drop_captions(text.to(self.device), keep)  # (n, L, Dt)
        if self.autoregressive:
            return self.finish_step(self.forward_backward_tokens(data.to(self.device), text))
        x0 = data.to(self.device, torch.float32)  # (n, C, T, H, W)
        mean, std = self.edm.log_sigma_normal()  # EDM's log-normal, or rectified flow's
        sigma = self.draws.sigma(self.step, b, p_mean=mean, p_std=std)[:n]  # (n,)
        sigma = sigma.to(self.device, torch.float32)
        # all frames: CP ranks split the tokens inside the model, the loss sees the full latent
        noise = self.draws.noise(self.step, (b, *x0.shape[1:]))[:n].to(self.device)  # (n,C,T,H,W)
        loss = self.forward_backward(x0, text, sigma, noise)
        return self.finish_step(loss)

    def drop_captions(self, text: torch.Tensor, keep: torch.Tensor,
                      lengths: torch.Tensor | None = None):  # fmt: skip
        """Caption dropout: a dropped caption becomes the null caption (the empty caption's
        embedding from the shards' text record; zeros without one), the condition classifier-free
        guidance uses for its unconditional branch. text (n, L, Dt), keep (n,) in {0, 1},
        lengths (n,) valid tokens (packs) -> text, or (text, lengths)."""
        k = keep.to(text.dtype)[:, None, None]  # (n, 1, 1)
        text = text * k + self.null_text.to(text.dtype) * (1 - k)  # (n, L, Dt)
        if lengths is None:
            return text
        null_len = torch.full_like(lengths, self.null_length)
        return text, torch.where(keep > 0, lengths, null_len)  # (n,)

    def local_slice(self, batch: LatentBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """This rank's (latents, text): its slice of a global batch, or the batch itself when the
        source already gives per-rank batches (shards)."""
        if self.local_batches:
            return batch.latents, batch.text
        b, r = self.local_batch_size, self.dims.dp_rank()
        return batch.latents[r * b : (r + 1) * b], batch.text[r * b : (r + 1) * b]

    def autocast(self):
        """The configured forward precision (bf16 autocast, FP8 GEMMs)."""
        dtype = torch.bfloat16 if self.cfg.train.dtype == "bfloat16" else torch.float32
        return (
            torch.autocast(self.device.type, dtype=dtype, enabled=dtype != torch.float32),
            fp8_autocast(self.fp8),
        )

    def forward_backward(self, x0: torch.Tensor, text: torch.Tensor, sigma: torch.Tensor,
                         noise: torch.Tensor) -> torch.Tensor | None:  # fmt: skip
        """Mean EDM loss of this rank's batch, after its backward; under PP the schedule runs the
        microbatches and only the last stage holds a loss (None elsewhere)."""
        cast, fp8 = self.autocast()
        if self.layout.pipe is not None:
            with cast:
                return self.layout.pipe.step(self.edm, x0, text, sigma=sigma, noise=noise)
        with cast, fp8:
            loss = self.edm.loss(self.model, x0, text, sigma=sigma, noise=noise).mean()
        loss.backward()
        return loss.detach()

    def forward_backward_tokens(
        self, tokens: torch.Tensor, text: torch.Tensor
    ) -> torch.Tensor | None:
        """Mean next-token cross-entropy (nats per token) of this rank's videos of token ids
        (n, T, H, W), after its backward (the autoregressive family); under PP the schedule runs
        the microbatches and only the last stage holds a loss (None elsewhere)."""
        cast, fp8 = self.autocast()
        if self.layout.pipe is not None:
            with cast:
                return self.layout.pipe.step_tokens(tokens, text)
        # tensor parallel: the head's logits are sharded over the vocabulary (a DTensor); the
        # cross-entropy reduces across the TP ranks without gathering them
        vocab_parallel = loss_parallel() if self.dims.tp_enabled else contextlib.nullcontext()
        with vocab_parallel:
            with cast, fp8:
                loss = next_token_loss(self.model(tokens, text), tokens.flatten(1))
            loss.backward()
        if isinstance(loss, DTensor):
            loss = loss.full_tensor()
        return loss.detach()

    def finish_step(self, loss: torch.Tensor | None) -> dict[str, float]:
        """Gradients final → global loss (non-finite: stop before the update) → clip → update.
        ``loss``: this rank's share of the global mean (None on pipeline stages without it)."""
        total = torch.zeros((), dtype=torch.float64, device=self.device)
        if loss is not None:
            total += loss.double()
        dist.all_reduce(total)  # equal within a model-parallel group: divide by its copies
        mean = total.item() / (self.world // self.dims.pp)
        if not math.isfinite(mean):
            self.optimizer.zero_grad(set_to_none=True)
            raise TrainingDiverged(
                f"loss is {mean} at step {self.step + 1}; stopped before the update, nothing was "
                "saved from this step (lower optim.lr or check the data)"
            )
        self.layout.sync_grads()
        grad_norm = self.layout.clip_grad_norm(self.cfg.optim.grad_clip or float("inf"))
        lr = self.update(grad_norm)
        return {"loss": mean, "grad_norm": grad_norm.item(), "lr": lr}

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

    # ------------------------------------------------------------------ packed step
    def pack_draws(self, batch: PackedLatentBatch) -> list[tuple[torch.Tensor, list, torch.Tensor]]:
        """Per pack: sigma (S,), noise [(C, T_s, H_s, W_s)], caption keep (S,), each a function of
        (train seed, step, the sample's loader position) only: the same in every layout."""
        d, seed, dev = self.cfg.diffusion, self.draws.seed, self.device
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
            noise = [  # (C, T, H, W) each; none for token ids (autoregressive)
                torch.randn(z.shape, generator=g).to(dev) if not self.autoregressive else None
                for z, g in zip(p.latents, gens["noise"], strict=True)
            ]
            mean, std = self.edm.log_sigma_normal()
            sigma = (mean + std * n).exp()  # (S,)
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

    def pack_work(self, batch: PackedLatentBatch) -> tuple[float, float]:
        """(unpadded tokens, training FLOPs) of this rank's packs: every sample at its length."""
        tokens = flops = 0.0
        m, patch = self.cfg.model, self.cfg.model.patch
        for p in batch.packs:
            if self.autoregressive:  # token ids (T, H, W): one token per cell
                grids = [tuple(z.shape) for z in p.latents]
            else:
                grids = [tuple(s // q for s, q in zip(z.shape[1:], patch)) for z in p.latents]
            lens = [g[0] * g[1] * g[2] for g in grids]
            tokens += sum(lens)
            flops += train_flops(m, seq_lens=lens, grid=grids, text_len=m.text_len)["total"]
        return tokens, flops

    def pack_loss(self, pack: LatentPack, sigma: torch.Tensor, noise: list,
                  keep: torch.Tensor) -> torch.Tensor:  # fmt: skip
        """Per-sample loss (S,) of one pack through ``forward_packed``: EDM, or next-token
        cross-entropy over the real tokens (autoregressive)."""
        patch, dev = self.cfg.model.patch, self.device
        if self.autoregressive:
            layout = PackLayout.from_grids([tuple(z.shape) for z in pack.latents], pack.length)
            ids = torch.zeros(pack.length, dtype=torch.long)
            ids[: layout.n_tokens] = torch.cat([z.flatten() for z in pack.latents])
            ids = ids.to(dev)
            text, lengths = self.drop_captions(pack.text.to(dev), keep, pack.text_lengths.to(dev))
            cast, fp8 = self.autocast()
            with cast, fp8:
                logits = self.model.forward_packed(ids, text, lengths, layout)
                return packed_next_token_loss(logits, ids, layout)  # (S,)
        x0, layout = pack_latents(
            [z.to(dev, torch.float32) for z in pack.latents], patch, pack.length
        )  # (N, C*P) fmt: skip
        noise_tok, _ = pack_latents(noise, patch, pack.length)  # (N, C*P)
        text, lengths = self.drop_captions(pack.text.to(dev), keep, pack.text_lengths.to(dev))

        def net(x, c_noise, txt):
            return self.model.forward_packed(x, c_noise, txt, lengths, layout)  # (N, C*P)

        cast, fp8 = self.autocast()
        with cast, fp8:
            return packed_loss(self.edm, net, x0, text, sigma=sigma.to(dev, torch.float32),
                               noise=noise_tok, sample_ids=layout.sample_ids.to(dev))  # fmt: skip

    def train_packed(self, batch: PackedLatentBatch) -> dict[str, float]:
        """One step on packs (module docstring): forward + backward of every pack, then as an
        unpacked step."""
        weight = self.pack_weight(batch)
        total = torch.zeros((), dtype=torch.float64, device=self.device)
        for pack, (sigma, noise, keep) in zip(batch.packs, self.pack_draws(batch), strict=True):
            loss = self.pack_loss(pack, sigma, noise, keep).sum() * weight
            loss.backward()
            total += loss.detach().double()
        return self.finish_step(total)

    # ------------------------------------------------------------------ metrics and loop
    def metrics(
        self, step_out: dict[str, float], *, step_time: float, data_time: float, batch: int
    ) -> dict[str, float]:
        """Throughput of the global step; TFLOPS and MFU per process (GPU); with a blend of
        datasets, the samples drawn from each so far (``data/samples/<name>``). ``batch``:
        samples of the batch the source gave (this rank's slice with shards)."""
        drawn = getattr(self.source, "dataset_samples", {})  # blend: over all dp ranks
        if self.packed_work is not None:  # packs: real tokens, every sample's own FLOPs
            tokens_per_s = self.packed_work[0] / step_time
            achieved = self.packed_work[1] / step_time  # FLOP/s
        else:
            samples = batch * self.dims.dp if self.local_batches else batch
            tokens_per_s = samples * self.tokens_per_sample / step_time
            achieved = tokens_per_s * self.flops_per_token  # FLOP/s
        if achieved / self.world > self.peak_flops and self.device.type == "cpu":
            if not self.peak_rechecked:  # once: the start-up measurement met a busy machine
                self.peak_rechecked = True
                self.peak_flops, self.peak_source = recheck_cpu_peak(
                    self.peak_flops, self.peak_source, achieved=achieved / self.world,
                    width=self.cfg.model.hidden, dtype=self.cfg.train.dtype,
                )  # fmt: skip
        return {
            **step_out,
            "tokens_per_s": tokens_per_s,
            "tflops": achieved / self.world / 1e12,
            "mfu": achieved / self.world / self.peak_flops,
            "data_wait": data_time / step_time,
            "step_time": step_time,
            "peak_mem_gb": peak_memory_gb(self.device),
            **{f"data/samples/{name}": float(n) for name, n in drawn.items()},
        }

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
