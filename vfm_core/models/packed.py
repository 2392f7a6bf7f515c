"""Packed sequences through the DiT: several samples of different latent grids in one token
sequence (THD layout), each with its own noise level, caption and 3D RoPE positions.

:meth:`vfm_core.models.dit.DiT.forward_packed` runs a pack; this module holds what it needs
besides the tokens:

* :class:`TokenPack` — the per-token side information the blocks get: the sample of every token
  (modulation and gates are computed once per sample, (S, D), then gathered per token, so each
  sample keeps its own c_noise), the attention group ids of each self-attention layout over the
  *whole* pack, and the cross-attention mask (a token sees its own sample's caption only);
* :func:`pack_latents` / :func:`unpack_latents` — latents [(C, T, H, W)] <-> packed patch tokens
  (length, C*P) plus their :class:`~vfm_core.data.packing.PackLayout`.

Self-attention in a pack is full attention under the mask ``groups[:, None] == groups[None, :]``
(:func:`~vfm_core.data.packing.attention_groups`): the sample for full attention, (sample, t) for
ST-DiT's spatial and (sample, h, w) for its temporal attention. The same ids go to the
context-parallel attention callables (ring / all-to-all take the whole pack's ids), which is why
they are kept for the whole pack while ``token_sample`` and ``cross_mask`` follow the local
tokens (``parallelize_dit`` cuts them exactly like the tokens).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from vfm_core.geometry import (
    Grid,
    PackLayout,
    attention_groups,
    cross_attention_mask,
    pack_tokens,
    unpack_tokens,
)
from vfm_core.models.layers import ShapeError, patchify, unpatchify


@dataclass(kw_only=True, slots=True)
class TokenPack:
    """Side information of one pack for the DiT blocks (all on the tokens' device)."""

    token_sample: torch.Tensor
    """(n,) int64 sample index of every token the block holds (padding -> 0; its output is
    ignored by the loss)."""
    groups: dict[str, torch.Tensor]
    """Self-attention layout ("full" | "spatial" | "temporal" | "causal") -> (N,) int64 group
    ids of the whole pack (see :func:`vfm_core.data.packing.attention_groups`; causal: the
    sample, under the causal mask)."""
    cross_mask: torch.Tensor
    """(n_attn, S*L) bool: query token -> text tokens of its own sample, rows for the tokens the
    cross-attention sees."""

    def per_token(self, values: torch.Tensor) -> torch.Tensor:
        """Per-sample (S, D) -> per-token (1, n, D)."""
        return values[self.token_sample][None]  # (1, n, D)


def token_pack(
    layout: PackLayout,
    text_lengths: torch.Tensor,
    layouts: Sequence[str],
    *,
    device: torch.device | str | None = None,
) -> TokenPack:
    """The :class:`TokenPack` of ``layout`` for the self-attention ``layouts`` a model uses."""
    ids = layout.sample_ids
    # causal (autoregressive) attention inside a pack: the document mask of full attention
    kind = {"causal": "full"}
    return TokenPack(
        token_sample=ids.clamp(min=0).to(device),
        groups={
            name: attention_groups(layout, kind.get(name, name)).to(device) for name in set(layouts)
        },
        cross_mask=cross_attention_mask(ids.cpu(), text_lengths.cpu()).to(device),
    )


def pack_latents(
    latents: Sequence[torch.Tensor], patch: Grid, length: int | None = None
) -> tuple[torch.Tensor, PackLayout]:
    """Per-sample latents [(C, T_s, H_s, W_s)] -> packed patch tokens (length, C*P) (zero padded
    up to ``length``, default: no padding) and their layout."""
    if not latents:
        raise ValueError("pack_latents: no latents to pack")
    tokens, grids = [], []
    for i, z in enumerate(latents):
        if z.ndim != 4:
            raise ShapeError(f"latents[{i}]: expected (C, T, H, W), got {tuple(z.shape)}")
        tok, grid = patchify(z[None], patch)  # (1, n_s, C*P)
        tokens.append(tok[0])
        grids.append(grid)
    layout = PackLayout.from_grids(grids, length)
    return pack_tokens(tokens, layout), layout  # (length, C*P)


def unpack_latents(
    tokens: torch.Tensor, layout: PackLayout, patch: Grid, channels: int
) -> list[torch.Tensor]:
    """Inverse of :func:`pack_latents`: (length, C*P) -> [(C, T_s, H_s, W_s)]."""
    return [
        unpatchify(t[None], grid, patch, channels)[0]  # (C, T, H, W)
        for t, grid in zip(unpack_tokens(tokens, layout), layout.grids)
    ]
