"""Training objectives as components: what a step draws, what the model is fed, what it is scored
on. The trainer knows no family: it asks the family for its objective
(:meth:`vfm_core.families.Family.objective`).

An objective turns this rank's share of a step's batch into :class:`Microbatch` es
(:meth:`Objective.microbatches`) and scores the model's output on one of them
(:meth:`Objective.loss`). Every draw is counter-based (:mod:`vfm_core.rng`: keyed by
step and global sample position, the same numbers in every layout), and a microbatch's loss is
the sum over its samples of ``weight x per-sample loss`` with ``weight = dp / (samples of the
global step)``: the microbatches of all data-parallel ranks (each averaged over dp by the
gradient reduction) add up to the mean over the global batch, however the batch is cut into
gradient-accumulation passes and pipeline microbatches.

The families' objectives: :class:`vfm_core.families.diffusion.DiffusionObjective` (EDM, or
rectified flow in the same interface) and
:class:`vfm_core.families.autoregressive.NextTokenObjective` (next-token cross-entropy).

Unpacked batches are cut into equal microbatches of samples; packed batches (``data.max_tokens``)
give one microbatch per pack, each with the :class:`~vfm_core.geometry.PackLayout` the loader
built for it.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

import torch

from vfm_core.config import Config
from vfm_core.data.samples import TrainBatch
from vfm_core.geometry import PackLayout, pack_tokens, patchify
from vfm_core.rng import StepRNG, counter_generator


@dataclass(kw_only=True, slots=True)
class Microbatch:
    """One forward/backward's worth of this rank's step: the model call and what scores it."""

    inputs: torch.Tensor
    """The model's data input (the first pipeline stage's): latents x_in (b, C, T, H, W) or
    packed tokens (1, length, C*P); token ids (b, T, H, W) or packed ids (1, length)."""
    kwargs: dict[str, Any]
    """Conditioning every stage needs, passed as keywords to the model's forward (c_noise, text,
    and for packs text_lengths and layout; grid for the stages after the first)."""
    target: torch.Tensor
    """What the output is scored against: F's target (like the output; packed (length, C*P)) or
    the next-token ids (b, N) / (length,)."""
    weight: torch.Tensor
    """(S,) each sample's share of the global step's mean loss (dp / global samples)."""
    layout: PackLayout | None = None
    """The pack's token layout (packed), else None."""
    loss_mask: torch.Tensor | None = None
    """(b, 1, T, 1, 1) 1 where the output is scored, 0 on clean conditioning frames
    (frame-conditioned samples); None: everywhere."""

    @property
    def n_samples(self) -> int:
        return int(self.weight.shape[0])


class Objective:
    """What every objective shares: caption dropout to the null caption, and the cut of a batch
    into microbatches. Subclasses draw and score (:meth:`batched`, :meth:`packed`, :meth:`loss`)."""

    def __init__(
        self,
        cfg: Config,
        *,
        draws: StepRNG,
        device: torch.device,
        local_batch: int,
        null_text: torch.Tensor,
        null_length: int,
        tensor_parallel: bool,
    ):
        self.cfg, self.draws, self.device = cfg, draws, device
        self.local_batch = local_batch  # samples of this rank's share of a step (unpacked)
        self.null_text = null_text.to(device)  # (L, Dt) the empty caption's embedding
        self.null_length = null_length
        self.tensor_parallel = tensor_parallel
        self.grid = tuple(
            s // p
            for s, p in zip(
                (cfg.data.latent_frames, cfg.data.latent_height, cfg.data.latent_width),
                cfg.model.patch,
                strict=True,
            )
        )

    def context(self):
        """What the forward and backward run under (nothing here; see subclasses)."""
        return contextlib.nullcontext()

    # ------------------------------------------------------------------ batches
    def microbatches(
        self, batch: TrainBatch, *, step: int, weight: float, splits: int
    ) -> list[Microbatch]:
        """This rank's part of the step as microbatches: ``splits`` equal cuts of its samples,
        or one per pack. ``batch``: this rank's samples (unpacked) or packs; ``weight``: dp /
        samples of the global step."""
        if batch.packed:
            return [self.packed(p, step=step, weight=weight) for p in batch.packs()]
        whole = self.batched(batch, step=step, weight=weight)
        n = whole.n_samples
        if n % splits:
            raise ValueError(f"{n} samples cannot be cut into {splits} equal microbatches")
        size = n // splits
        return [_slice(whole, i * size, size) for i in range(splits)]

    def drop_captions(
        self, text: torch.Tensor, keep: torch.Tensor, lengths: torch.Tensor | None = None
    ):
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

    def pack_draws(self, pack: TrainBatch, step: int, *, noise: bool) -> tuple:
        """(sigma (S,) float64, noise (length, C*p) like the pack's tokens | None, keep (S,)
        bool) of a one-pack batch, keyed by (train seed, step, each sample's loader position);
        each sample's noise is drawn in its latent shape (C, T, H, W), then patchified."""
        seed = self.draws.seed
        gens = {
            what: [counter_generator(seed, what, step, pos) for pos in pack.positions]
            for what in ("sigma", "noise", "keep")
        }
        n = torch.cat([torch.randn(1, generator=g, dtype=torch.float64) for g in gens["sigma"]])
        u = torch.cat([torch.rand(1, generator=g, dtype=torch.float64) for g in gens["keep"]])
        eps = None
        if noise:
            (layout,) = pack.layouts  # type: ignore[misc]
            m = self.cfg.model
            shapes = [
                (m.in_channels, *(g * p for g, p in zip(grid, m.patch, strict=True)))
                for grid in layout.grids
            ]  # (C, T, H, W) of each sample
            eps = pack_tokens(
                [
                    patchify(torch.randn(shape, generator=g)[None], m.patch)[0][0]  # (n_s, C*p)
                    for shape, g in zip(shapes, gens["noise"], strict=True)
                ],
                layout,
            )  # (length, C*p)
        return n, eps, u >= self.cfg.diffusion.cond_dropout

    def batched(self, batch: TrainBatch, *, step: int, weight: float) -> Microbatch:
        """An unpacked batch's one microbatch (cut by :meth:`microbatches`)."""
        raise NotImplementedError

    def packed(self, pack: TrainBatch, *, step: int, weight: float) -> Microbatch:
        """A one-pack batch's microbatch."""
        raise NotImplementedError

    def loss(self, output: torch.Tensor, mb: Microbatch) -> torch.Tensor:
        raise NotImplementedError


def _slice(mb: Microbatch, start: int, size: int) -> Microbatch:
    """Samples [start, start + size) of an unpacked microbatch."""
    if start == 0 and size == mb.n_samples:
        return mb
    cut = slice(start, start + size)
    kwargs = {k: (v[cut] if torch.is_tensor(v) else v) for k, v in mb.kwargs.items()}
    mask = mb.loss_mask[cut] if mb.loss_mask is not None else None
    return Microbatch(
        inputs=mb.inputs[cut],
        kwargs=kwargs,
        target=mb.target[cut],
        weight=mb.weight[cut],
        loss_mask=mask,
    )
