"""Packed sequences through the DiT: several samples of different latent grids in one token
sequence (THD layout), each with its own noise level, caption and 3D RoPE positions.

:meth:`vfm_core.models.dit.DiT.forward_packed` runs a pack; this module holds what it needs
besides the tokens:

* :class:`TokenPack` — the sample of every token the blocks hold (modulation and gates are
  computed once per sample, (S, D), then gathered per token, so each sample keeps its own
  c_noise);
* :func:`pack_attention` — the pack's :class:`~vfm_core.models.attention_spec.AttentionSpec`: the
  attention group ids of each self-attention layout over the *whole* pack, and the
  cross-attention mask (a token sees its own sample's caption only).
(:func:`~vfm_core.geometry.pack_latents` / :func:`~vfm_core.geometry.unpack_latents` turn
latents [(C, T, H, W)] into packed patch tokens (length, C*P) and back: token geometry.)

Self-attention in a pack is full attention under the mask ``groups[:, None] == groups[None, :]``
(:func:`~vfm_core.data.packing.attention_groups`): the sample for full attention, (sample, t) for
ST-DiT's spatial and (sample, h, w) for its temporal attention. The same ids go to the
context-parallel attention core (ring / all-to-all take the whole pack's ids), which is why
they are kept for the whole pack while ``token_sample`` and the cross-attention mask's rows
follow the local tokens (``parallelize_dit`` cuts them exactly like the tokens).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from vfm_core.geometry import PackLayout, attention_groups, cross_attention_mask
from vfm_core.models.attention_spec import AttentionSpec


@dataclass(kw_only=True, slots=True)
class TokenPack:
    """Per-token side information of one pack for the blocks (on the tokens' device)."""

    token_sample: torch.Tensor
    """(n,) int64 sample index of every token the block holds (padding -> 0; its output is
    ignored by the loss); or (B, n): the modulation row of every token of a batch (per-frame
    noise levels, :func:`frame_rows`)."""

    def per_token(self, values: torch.Tensor) -> torch.Tensor:
        """Per-row (S, D) -> per-token (1, n, D), or (B, n, D) for a batch's rows."""
        out = values[self.token_sample]  # (n, D) | (B, n, D)
        return out[None] if self.token_sample.ndim == 1 else out


def frame_rows(grid: tuple[int, int, int], batch: int, *, device=None) -> TokenPack:
    """The modulation rows of a batch whose noise level varies by latent frame: token n of
    sample b (raster order over ``grid`` (t, h, w)) takes row ``b·t + its frame``."""
    t, h, w = grid
    frame = torch.arange(t, device=device).repeat_interleave(h * w)  # (N,)
    rows = torch.arange(batch, device=device)[:, None] * t + frame[None]  # (B, N)
    return TokenPack(token_sample=rows)


def token_pack(layout: PackLayout, *, device: torch.device | str | None = None) -> TokenPack:
    """The :class:`TokenPack` of ``layout``."""
    return TokenPack(token_sample=layout.sample_ids.clamp(min=0).to(device))


def pack_attention(
    layout: PackLayout,
    text_lengths: torch.Tensor,
    layouts: Sequence[str],
    *,
    device: torch.device | str | None = None,
) -> AttentionSpec:
    """The :class:`AttentionSpec` of a pack for the self-attention ``layouts`` a model uses:
    ``groups`` (N,) per layout (causal: the sample's document mask, under the causal mask) and
    the cross-attention ``mask`` (1, 1, N, S*L) of every token's own caption."""
    ids = layout.sample_ids
    kind = {"causal": "full"}
    groups = {
        name: attention_groups(layout, kind.get(name, name)).to(device) for name in set(layouts)
    }
    cross = cross_attention_mask(ids.cpu(), text_lengths.cpu()).to(device)  # (N, S*L)
    return AttentionSpec(groups=groups, mask=cross[None, None])
