"""What one attention call attends: which queries see which keys, as one typed value.

A model builds one :class:`AttentionSpec` per forward (the token grid or the pack's group ids,
causal or not, the caption's key mask) and hands it to every block; a block takes the view of
each of its passes (:meth:`AttentionSpec.for_layout` for self-attention, :meth:`AttentionSpec.
cross` for cross-attention) and the attention module hands it, unchanged, to its core
(:class:`~vfm_core.models.local_attention.LocalAttention` on one device, the context-parallel
core ``vfm_core.parallel`` swaps in): the core alone decides how to compute it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Literal

import torch

from vfm_core.geometry import Grid
from vfm_core.models.layers import padding_mask

Layout = Literal["full", "spatial", "temporal", "causal"]
"""Self-attention layouts: full 3D attention (DiT), within a frame / across frames (ST-DiT), and
causal full attention (the autoregressive family: token i sees tokens <= i)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class AttentionSpec:
    """Which tokens attend to which in one attention call (see the module docstring)."""

    layout: Layout = "full"
    """The self-attention pass; cross-attention is "full" under :attr:`mask`."""
    grid: Grid | None = None
    """(T, H, W) token grid of a batch in raster order: spatial / temporal passes group by it.
    None for packs (their groups are ids) and cross-attention."""
    groups: Mapping[str, torch.Tensor] | None = None
    """Packs (THD): layout -> (N,) int64 group ids of the *whole* pack; a token attends only to
    tokens of its group (the sample; (sample, t) spatial; (sample, h, w) temporal; causal: the
    sample, under the causal mask). Whole, so context parallelism sees every rank's ids."""
    mask: torch.Tensor | None = None
    """Cross-attention key mask, bool, True = attend, broadcast to the scores (B, H, N, S):
    (1, 1, N, S) a pack's tokens see their own caption, (B, 1, 1, S) the real tokens of
    zero-padded captions; None: every key. Self-attention views carry none."""

    @property
    def causal(self) -> bool:
        return self.layout == "causal"

    @property
    def sample_ids(self) -> torch.Tensor | None:
        """(N,) group ids of this pass over the whole pack; None unpacked."""
        return None if self.groups is None else self.groups[self.layout]

    def for_layout(self, layout: Layout) -> AttentionSpec:
        """The view of one self-attention pass of this forward."""
        return replace(self, layout=layout, mask=None)

    def cross(self) -> AttentionSpec:
        """The view of cross-attention (queries: the tokens, keys: the caption)."""
        return AttentionSpec(mask=self.mask)


FULL_ATTENTION = AttentionSpec()
"""Every query attends to every key: plain (self- or cross-) attention."""


def caption_mask(text: torch.Tensor) -> torch.Tensor | None:
    """:attr:`AttentionSpec.mask` of zero-padded captions (B, L, Dt): (B, 1, 1, L), True for
    the real tokens (:func:`~vfm_core.models.layers.padding_mask`); None when nothing is padded."""
    real = padding_mask(text)  # (B, L) or None
    return None if real is None else real[:, None, None]
