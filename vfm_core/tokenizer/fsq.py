"""Finite scalar quantisation (FSQ, Mentzer et al. 2023): a discrete bottleneck without a codebook.

Each of the C = len(levels) latent channels is squashed into a bounded range and rounded to one of
``levels[c]`` values; a code is the tuple of C rounded values, its index the mixed-radix number of
those digits, so the vocabulary is prod(levels) (8,8,8,5,5,5 -> 64,000). Rounding passes the
gradient straight through. Nothing is learned here: the encoder learns to use the grid.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import nn


class FSQError(ValueError):
    """Levels, token ids or a code grid that do not fit the quantiser."""


def check_levels(levels: Sequence[int]) -> tuple[int, ...]:
    levels = tuple(int(v) for v in levels)
    if not levels or any(v < 2 for v in levels):
        raise FSQError(f"FSQ levels: need one or more integers >= 2, got {list(levels)}")
    return levels


class FSQ(nn.Module):
    """Quantise (..., C) latents to the grid of ``levels``; codes are in [-1, 1] per channel."""

    def __init__(self, levels: Sequence[int], eps: float = 1e-3):
        super().__init__()
        self.levels = check_levels(levels)
        self.eps = eps
        lv = torch.tensor(self.levels, dtype=torch.float64)
        basis = torch.cumprod(torch.tensor((1, *self.levels[:-1]), dtype=torch.int64), 0)
        self.register_buffer("_levels", lv, persistent=False)
        self.register_buffer("_basis", basis, persistent=False)  # mixed-radix place values

    @property
    def dim(self) -> int:
        return len(self.levels)

    @property
    def vocab_size(self) -> int:
        return math.prod(self.levels)

    def _bound(self, z: torch.Tensor) -> torch.Tensor:
        """(..., C) real -> (..., C) in (-L/2, L/2), shifted so even L rounds to L values."""
        lv = self._levels.to(z.dtype)
        half = (lv - 1) * (1 + self.eps) / 2
        offset = torch.where(lv % 2 == 0, 0.5, 0.0).to(z.dtype)
        shift = torch.atanh(offset / half)
        return torch.tanh(z + shift) * half - offset

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        """(..., C) latents -> (..., C) codes in [-1, 1], straight-through gradient."""
        if z.shape[-1] != self.dim:
            raise FSQError(f"FSQ with {self.dim} levels got latents with {z.shape[-1]} channels")
        b = self._bound(z)
        q = b + (b.round() - b).detach()  # (..., C) integers in [-L//2, (L-1)//2]
        return q / (self._levels.to(z.dtype) // 2)  # (..., C)

    def codes_to_indices(self, codes: torch.Tensor) -> torch.Tensor:
        """(..., C) codes from :meth:`forward` -> (...,) int64 token ids in [0, vocab)."""
        half = self._levels // 2  # (C,)
        digits = (codes.double() * half + half).round().long()  # (..., C) in [0, L)
        return (digits * self._basis).sum(-1)

    def indices_to_codes(self, ids: torch.Tensor) -> torch.Tensor:
        """(...,) token ids -> (..., C) float codes; ids outside [0, vocab) are an error."""
        if ids.dtype.is_floating_point:
            raise FSQError(f"token ids must be integers, got {ids.dtype}")
        if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= self.vocab_size):
            raise FSQError(
                f"token ids must lie in [0, {self.vocab_size}) for FSQ levels {list(self.levels)}, "
                f"got min {int(ids.min())} max {int(ids.max())}"
            )
        lv = self._levels.long()
        digits = (ids.long()[..., None] // self._basis) % lv  # (..., C)
        half = self._levels // 2
        return ((digits.double() - half) / half).float()
