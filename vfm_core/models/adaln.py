"""Adaptive LayerNorm conditioning: AdaLN-Zero (DiT, Peebles & Xie 2023) and AdaLN-LoRA (Cosmos,
NVIDIA 2025 §5.1).

Each sub-layer (attention, cross-attention, MLP) of a block is modulated by (shift, scale, gate),
all
functions of the per-sample conditioning embedding ``emb`` (B, D):

* **zero**: per block ``Linear(SiLU(emb))`` D -> n·3D. At D=4096 this is 3·n·D² parameters a block —
  a large share of a 7B model.
* **lora**: a global term G(emb) (B, 3D) computed once per forward and shared by all blocks, plus a
  per-block, per-sub-layer low-rank term U_i·V_i·SiLU(emb) with rank r: 2·r·D + 3·r·D parameters.

Both are zero-initialised so every block starts as the identity (the "Zero" of AdaLN-Zero).
"""

from __future__ import annotations

import torch
from torch import nn


def modulate(x: torch.Tensor, shift: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """x · (1 + scale) + shift: x (B, N, D) with per-sample (B, D) or per-token (B, N, D) shift
    and scale (packs). One full-size pass (``addcmul``), not a multiply then an add; the same
    values, and autograd saves the same x and (1 + scale)."""
    if shift.ndim == 2:
        shift, scale = shift[:, None], scale[:, None]  # (B, 1, D)
    return torch.addcmul(shift, x, 1 + scale)  # (B, N, D)


def gated_residual(x: torch.Tensor, gate: torch.Tensor, branch: torch.Tensor) -> torch.Tensor:
    """x + gate · branch, the AdaLN gated residual (x, branch (B, N, D); gate (B, D) per sample
    or (B, N, D) per token) in one full-size pass (``addcmul``)."""
    return torch.addcmul(x, per_token(gate), branch)  # (B, N, D)


def per_token(gate: torch.Tensor) -> torch.Tensor:
    """A gate (B, D) per sample -> (B, 1, D); per-token gates (B, N, D) stay as they are."""
    return gate[:, None] if gate.ndim == 2 else gate


class AdaLNGlobal(nn.Module):
    """The shared AdaLN-LoRA term: emb (B, D) -> (B, 3D), computed once per forward pass."""

    def __init__(self, dim: int):
        super().__init__()
        self.proj = nn.Linear(dim, 3 * dim)

    def forward(self, emb: torch.Tensor) -> torch.Tensor:
        return self.proj(nn.functional.silu(emb))  # (B, 3D)


class Modulation(nn.Module):
    """Per-block modulation for ``n`` sub-layers -> list of n (shift, scale, gate), each (B, D)."""

    def __init__(self, dim: int, n: int, *, mode: str, rank: int = 0):
        super().__init__()
        self.n, self.mode = n, mode
        if mode == "zero":
            self.proj = nn.Linear(dim, n * 3 * dim)
        elif mode == "lora":
            self.down = nn.ModuleList(nn.Linear(dim, rank, bias=False) for _ in range(n))
            self.up = nn.ModuleList(nn.Linear(rank, 3 * dim, bias=False) for _ in range(n))
        else:
            raise ValueError(f"model.adaln: unknown mode {mode!r} (zero | lora)")

    def forward(
        self, emb: torch.Tensor, shared: torch.Tensor | None
    ) -> list[tuple[torch.Tensor, ...]]:
        e = nn.functional.silu(emb)  # (B, D)
        if self.mode == "zero":
            chunks = self.proj(e).chunk(self.n, dim=-1)  # n × (B, 3D)
        else:
            if shared is None:
                raise ValueError("AdaLN-LoRA needs the shared global term")
            chunks = [up(down(e)) + shared for down, up in zip(self.down, self.up)]  # n × (B, 3D)
        return [tuple(c.chunk(3, dim=-1)) for c in chunks]  # n × (shift, scale, gate)
