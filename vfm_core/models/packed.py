"""Packed sequences through the DiT: several samples of different latent grids in one token
sequence (THD layout), each with its own noise level, caption and 3D RoPE positions.

:meth:`vfm_core.models.dit.DiT.forward_packed` runs a pack; this module holds what it needs
besides the tokens:

* :class:`TokenPack` — the per-token side information the blocks get: the sample of every token
  (modulation and gates are computed once per sample, (S, D), then gathered per token, so each
  sample keeps its own c_noise), the attention group ids of each self-attention layout over the
  *whole* pack, and the cross-attention mask (a token sees its own sample's caption only);
(:func:`~vfm_core.geometry.pack_latents` / :func:`~vfm_core.geometry.unpack_latents` turn
latents [(C, T, H, W)] into packed patch tokens (length, C*P) and back: token geometry.)

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

from vfm_core.geometry import PackLayout, attention_groups, cross_attention_mask


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
