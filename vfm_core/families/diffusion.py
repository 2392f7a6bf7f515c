"""The diffusion family: a DiT denoiser (``model.arch`` dit, stdit, llama_dit) over continuous
latents, trained by EDM or rectified flow.

* :class:`DiffusionObjective`: sigma, noise and caption dropout drawn per sample; the model sees
  ``x_in = c_in (x0 + sigma noise)`` and ``c_noise``; the per-sample loss is
  ``mean |F - target|^2`` (:meth:`~vfm_core.diffusion.edm.EDM.training_pair`), the same formula
  on the whole model and on a pipeline's last stage.
* :class:`DiffusionFamily`: the network, that objective, the DiT's own FLOP and parameter terms
  (patch embedding, timestep MLP, AdaLN, final layer; ST-DiT's spatial and temporal attention),
  synthetic latents.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch

from vfm_core.config import Config, DataConfig, ModelConfig
from vfm_core.data.samples import TrainBatch
from vfm_core.data.synthetic_latents import SyntheticLatents
from vfm_core.diffusion.objective import create_diffusion
from vfm_core.diffusion.packed import packed_training_pair
from vfm_core.families.family import Family
from vfm_core.families.objective import Microbatch, Objective
from vfm_core.families.terms import (
    Term,
    cross_terms,
    matmul_flops,
    mlp_flops,
    pooled_text_params,
    self_attention_terms,
)
from vfm_core.geometry import Grid, per_sample_mean, sample_grids
from vfm_core.models.dit import DiT, block_layouts


class DiffusionObjective(Objective):
    """EDM (Karras et al. 2022) or rectified flow (``diffusion.objective``), module docstring."""

    def __init__(self, cfg: Config, **kw: Any):
        super().__init__(cfg, **kw)
        self.edm = create_diffusion(cfg.diffusion)

    def batched(self, batch: TrainBatch, *, step: int, weight: float) -> Microbatch:
        b = self.local_batch
        x0 = batch.values.to(self.device, torch.float32)  # (n, C, T, H, W)
        n = x0.shape[0]  # below b when the loader skipped bad samples: the first n draws
        d = self.cfg.diffusion
        keep = self.draws.keep_caption(step, b, d.cond_dropout)[:n].to(self.device)  # (n,)
        text = self.drop_captions(batch.text.to(self.device), keep)  # (n, L, Dt)
        mean, std = self.edm.log_sigma_normal()  # EDM's log-normal, or rectified flow's
        sigma = self.draws.sigma(step, b, p_mean=mean, p_std=std)[:n]  # (n,) float64
        sigma = sigma.to(self.device, torch.float32)
        noise = self.draws.noise(step, (b, *x0.shape[1:]))[:n].to(self.device)  # like x0
        clean = self._clean_frames(step, b, n, x0.shape[2])  # (n, T) bool | None
        if clean is None:
            x_in, target = self.edm.training_pair(x0, sigma, noise)  # (n, C, T, H, W) each
            c_noise, mask = self.edm.precondition(sigma)[3], None  # (n,)
        else:  # clean leading frames: no noise, their own level, no loss
            x_in, target, c_noise, mask = self._conditioned_pair(x0, sigma, noise, clean)
        return Microbatch(
            inputs=x_in,
            kwargs={"c_noise": c_noise, "text": text, "grid": self.grid},
            target=target,
            weight=torch.full((n,), weight, device=self.device),
            loss_mask=mask,
        )

    def _clean_frames(self, step: int, b: int, n: int, frames: int) -> torch.Tensor | None:
        """(n, T) which latent frames of each sample stay clean (``diffusion.frame_cond``);
        None when none does (the step's draws are per global sample, any layout alike)."""
        d, pt = self.cfg.diffusion, self.cfg.model.patch[0]
        if not d.frame_cond:
            return None
        k = self.draws.cond_frames(step, b, d.frame_cond, d.frame_cond_max // pt)[:n] * pt
        return (torch.arange(frames)[None] < k[:, None]).to(self.device)  # (n, T)

    def _conditioned_pair(
        self, x0: torch.Tensor, sigma: torch.Tensor, noise: torch.Tensor, clean: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """(x_in, target, c_noise (n, T/p_t), loss mask (n, 1, T, 1, 1)) of samples whose
        ``clean`` frames keep their latent (noise level ``sigma_min``, no noise added)."""
        keep = clean[:, None, :, None, None]  # (n, 1, T, 1, 1)
        level = torch.full_like(sigma, self.cfg.diffusion.sigma_min)[:, None, None, None, None]
        per_frame = torch.where(keep, level, sigma[:, None, None, None, None])  # (n,1,T,1,1)
        x_in, target = self.edm.training_pair(x0, per_frame, noise * ~keep)  # like x0
        c_noise = self.edm.precondition(per_frame)[3][:, 0, :, 0, 0]  # (n, T)
        pt = self.cfg.model.patch[0]
        return x_in, target, c_noise[:, ::pt].contiguous(), (~keep).to(x0.dtype)

    def packed(self, pack: TrainBatch, *, step: int, weight: float) -> Microbatch:
        dev = self.device
        z, eps, keep = self.pack_draws(pack, step, noise=True)
        mean, std = self.edm.log_sigma_normal()
        sigma = (mean + std * z).exp().to(dev, torch.float32)  # (S,)
        (layout,) = pack.layouts  # type: ignore[misc]
        x0 = pack.values[0].to(dev, torch.float32)  # (length, C*P)
        noise = eps.to(dev)  # (length, C*P)
        ids = layout.sample_ids.to(dev)
        x_in, target = packed_training_pair(self.edm, x0, sigma, noise, ids)  # (length, C*P)
        text, lengths = self.drop_captions(
            pack.text.to(dev), keep.to(dev), pack.text_lengths.to(dev)
        )
        kwargs = {
            "c_noise": self.edm.precondition(sigma)[3],
            "text": text,
            "text_lengths": lengths,
            "layout": layout,
        }
        return Microbatch(
            inputs=x_in[None],
            kwargs=kwargs,
            target=target,
            layout=layout,
            weight=torch.full((pack.n_samples,), weight, device=dev),
        )

    def loss(self, output: torch.Tensor, mb: Microbatch) -> torch.Tensor:
        return diffusion_loss(output, mb)


def diffusion_loss(output: torch.Tensor, mb: Microbatch) -> torch.Tensor:
    """sum_s weight_s * mean over the sample's elements of (F - target)^2 (one microbatch)."""
    f = output.to(mb.target.dtype)
    if mb.loss_mask is not None:  # the scored elements only (not the clean frames)
        err = (f - mb.target).square() * mb.loss_mask  # (b, C, T, H, W)
        scored = mb.loss_mask.expand_as(err).flatten(1).sum(1)  # (b,)
        per_sample = err.flatten(1).sum(1) / scored  # (b,)
    elif mb.layout is None:
        per_sample = (f - mb.target).square().flatten(1).mean(1)  # (b,)
    else:
        token = (f[0] - mb.target).square().mean(1)  # (length,)
        ids = mb.layout.sample_ids.to(token.device)
        per_sample = per_sample_mean(token, ids, mb.layout.n_samples)  # (S,)
    return (per_sample * mb.weight).sum()


class DiffusionFamily(Family):
    name = "diffusion"
    model_cls = DiT
    objective_cls = DiffusionObjective

    def flop_terms(
        self, cfg: ModelConfig, lens: list[int], grid: Grid | Sequence[Grid] | None, L: float
    ) -> list[Term]:
        needs_grid = cfg.arch == "stdit" and any(
            block_layouts(cfg, i) != ("full",) for i in range(cfg.depth)
        )
        grids = sample_grids(lens, grid) if needs_grid or grid is not None else None
        n = float(sum(lens))  # video tokens
        b = float(len(lens))  # samples
        d = cfg.hidden
        inner = cfg.heads * cfg.head_dim  # query / output width
        patch_dim = cfg.in_channels * math.prod(cfg.patch)

        def attn(layout: str) -> float:
            """Scores Q·Kᵀ and values P·V: 4·S²·inner summed over the attention groups."""
            if layout == "full":
                return sum(4.0 * s * s * inner for s in lens)
            assert grids is not None
            if layout == "spatial":  # per frame: t groups of h·w tokens
                return sum(4.0 * t * (h * w) ** 2 * inner for t, h, w in grids)
            return sum(4.0 * (h * w) * t * t * inner for t, h, w in grids)  # temporal

        terms = [
            Term("patch_embed", matmul_flops(n, patch_dim + cfg.abs_pos, d), False),  # + positions
            Term("timestep_embed", matmul_flops(b, cfg.freq_dim, d), False),  # input: sinusoids
            Term("timestep_embed", matmul_flops(b, d, d), True),
        ]
        if not cfg.cross_attention:  # input: the caption, data
            terms.append(Term("text_embed", matmul_flops(b, cfg.text_dim, d), False))
        if cfg.adaln == "lora":
            terms.append(Term("adaln", matmul_flops(b, d, 3 * d), True))  # shared global D -> 3D
        for i in range(cfg.depth):
            layouts = block_layouts(cfg, i)
            # self-attention passes + cross-attention + MLP
            n_sub = len(layouts) + (2 if cfg.cross_attention else 1)
            if cfg.adaln == "zero":
                terms.append(Term("adaln", matmul_flops(b, d, n_sub * 3 * d), True))
            else:
                r = cfg.adaln_lora_rank
                for _ in range(n_sub):
                    terms.append(Term("adaln", matmul_flops(b, d, r), True))
                    terms.append(Term("adaln", matmul_flops(b, r, 3 * d), True))
            for layout in layouts:  # each pass has its own q, k, v, o
                terms += self_attention_terms(cfg, n, attn(layout))
            terms += cross_terms(cfg, n, b, L)
            terms.append(Term("mlp", mlp_flops(cfg, n), True))
        terms.append(Term("adaln", matmul_flops(b, d, 2 * d), True))  # final-layer modulation
        terms.append(Term("final", matmul_flops(n, d, patch_dim), True))
        return terms

    def conditioning_flops(self, cfg: ModelConfig, timestep_embed: float) -> float:
        if cfg.adaln == "lora":  # global term: 2·D·3D forward, 3x trained
            return timestep_embed + 3 * 2.0 * cfg.hidden * 3 * cfg.hidden
        return timestep_embed

    def block_norm_params(self, cfg: ModelConfig, sublayers: int) -> int:
        d, n = cfg.hidden, sublayers
        if cfg.adaln == "zero":
            return d * n * 3 * d + n * 3 * d
        return n * (d * cfg.adaln_lora_rank + cfg.adaln_lora_rank * 3 * d)

    def nonblock_params(self, cfg: ModelConfig) -> int:
        """Patch embedding, timestep MLP, AdaLN-LoRA global term, the final layer and the pooled
        caption's projection."""
        d, cp = cfg.hidden, cfg.in_channels * math.prod(cfg.patch)
        total = (cp + cfg.abs_pos) * d + d + cfg.freq_dim * d + d + d * d + d  # (+ positions)
        total += pooled_text_params(cfg)
        if cfg.adaln == "lora":
            total += d * 3 * d + 3 * d
        return total + d * 2 * d + 2 * d + d * cp + cp

    def stage_nonblock_params(self, cfg: ModelConfig, *, stage: int, stages: int, tp: int) -> float:
        """Every stage's conditioning replica (timestep MLP (+ text), AdaLN-LoRA global term), the
        first stage's patch embedding, the last stage's final layer."""
        d, patch = cfg.hidden, cfg.in_channels * math.prod(cfg.patch)
        total = cfg.freq_dim * d + d + d * d + d + pooled_text_params(cfg)
        if cfg.adaln == "lora":
            total += d * 3 * d + 3 * d
        total += (patch + cfg.abs_pos) * d + d if stage == 0 else 0
        total += d * 2 * d + 2 * d + d * patch + patch if stage == stages - 1 else 0
        return total

    def synthetic_source(self, data: DataConfig, model: ModelConfig, *, sigma_data: float):
        return SyntheticLatents(data, model, sigma_data=sigma_data)

    def tokenizer_channels(self, model: ModelConfig) -> int | None:
        return model.in_channels


DIFFUSION = DiffusionFamily()
