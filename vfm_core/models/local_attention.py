"""Attention on one device as an :class:`~vfm_core.models.attention_spec.AttentionSpec` says:
the core of every attention module until a parallel layout swaps it.

Spatial / temporal passes regroup the raster-ordered tokens into frames / columns; RoPE is
applied on the full (t, h, w) grid before, so within a frame the t rotation is common to q and
k and cancels: spatial / temporal attention see exactly the 2D / 1D relative encoding. Packs
attend under group ids without an (N, N) mask (:func:`~vfm_core.models.flash.
grouped_attention`); causal attention after a KV cache builds the (n, C + n) mask.

The kernel (``sdpa`` | ``math`` | ``te``, :func:`~vfm_core.models.layers.attention`) is the
core's ``backend`` attribute, set per model by :func:`set_attention_backend`.
"""

from __future__ import annotations

import torch
from torch import nn

from vfm_core.geometry import Grid
from vfm_core.models.attention_spec import AttentionSpec, Layout
from vfm_core.models.flash import grouped_attention
from vfm_core.models.layers import ATTENTION_BACKENDS, attention


def group_tokens(x: torch.Tensor, grid: Grid, layout: Layout) -> torch.Tensor:
    """(B, h, N, d) with N = T*H*W raster order -> (B', h, S, d) attention groups."""
    if layout == "full":
        return x
    b, h, _, d = x.shape
    t, hh, ww = grid
    x = x.reshape(b, h, t, hh * ww, d)  # (B, h, T, HW, d)
    if layout == "spatial":
        return x.permute(0, 2, 1, 3, 4).reshape(b * t, h, hh * ww, d)  # (B*T, h, HW, d)
    return x.permute(0, 3, 1, 2, 4).reshape(b * hh * ww, h, t, d)  # (B*HW, h, T, d)


def ungroup_tokens(x: torch.Tensor, batch: int, grid: Grid, layout: Layout) -> torch.Tensor:
    """Inverse of :func:`group_tokens`: (B', h, S, d) -> (B, h, N, d)."""
    if layout == "full":
        return x
    t, hh, ww = grid
    h, d = x.shape[1], x.shape[-1]
    if layout == "spatial":
        x = x.reshape(batch, t, h, hh * ww, d).permute(0, 2, 1, 3, 4)  # (B, h, T, HW, d)
    else:
        x = x.reshape(batch, hh * ww, h, t, d).permute(0, 2, 3, 1, 4)  # (B, h, T, HW, d)
    return x.reshape(batch, h, t * hh * ww, d)


def causal_mask(
    n_q: int, n_k: int, sample_ids: torch.Tensor | None = None, device=None
) -> torch.Tensor | None:
    """(1, 1, n_q, n_k) bool, True = attend: the queries are the last n_q of n_k positions;
    with ``sample_ids`` (n_k,) a token also stays within its sample. None when nothing is
    masked (one new query over its cache)."""
    if n_q == 1 and sample_ids is None:
        return None
    qpos = torch.arange(n_k - n_q, n_k, device=device)  # (n_q,)
    keep = torch.arange(n_k, device=device)[None, :] <= qpos[:, None]  # (n_q, n_k)
    if sample_ids is not None:
        keep = keep & (sample_ids[n_k - n_q :, None] == sample_ids[None, :])
    return keep[None, None]


def local_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, spec: AttentionSpec, *, backend: str
) -> torch.Tensor:
    """q (B, Hq, N, d), k/v (B, Hkv, S, d) -> (B, Hq, N, d) on this device: cross-attention
    under ``spec.mask``; causal (S > N: the queries are the last N positions, after a KV
    cache); packed within ``spec.sample_ids``; full, or spatial / temporal groups of
    ``spec.grid``."""
    n, s = q.shape[2], k.shape[2]
    ids = spec.sample_ids
    if spec.mask is not None:
        if spec.mask.shape[-1] != s or spec.mask.shape[-2] not in (1, n):
            raise ValueError(
                f"attention mask: expected (.., {n} or 1, {s}) for {n} queries over {s} keys, "
                f"got {tuple(spec.mask.shape)}"
            )
        return attention(q, k, v, spec.mask, backend=backend)
    if spec.causal:
        if s != n:  # continues a KV cache
            return attention(q, k, v, causal_mask(n, s, ids, q.device), backend=backend)
        if ids is None:  # no (N, N) mask: SDPA's is_causal
            return attention(q, k, v, causal=True, backend=backend)
        return grouped_attention(q, k, v, ids, causal=True, backend=backend)
    if ids is not None:  # within each group of the pack, no (N, N) mask
        return grouped_attention(q, k, v, ids, backend=backend)
    if spec.layout == "full":
        return attention(q, k, v, backend=backend)
    grid = spec.grid
    if grid is None:
        raise ValueError(f"layout {spec.layout!r} needs the token grid")
    b = q.shape[0]
    q, k, v = (group_tokens(t, grid, spec.layout) for t in (q, k, v))  # (B', H, S', d)
    out = attention(q, k, v, backend=backend)  # (B', Hq, S', d)
    return ungroup_tokens(out, b, grid, spec.layout)  # (B, Hq, N, d)


class LocalAttention(nn.Module):
    """The single-device attention core (:func:`local_attention`); no parameters, no buffers
    (swapping it never changes a state dict). ``backend``: its kernel."""

    def __init__(self, backend: str = "sdpa"):
        super().__init__()
        self.backend = check_backend(backend)

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, spec: AttentionSpec
    ) -> torch.Tensor:
        return local_attention(q, k, v, spec, backend=self.backend)  # (B, Hq, N, d)

    def extra_repr(self) -> str:
        return f"backend={self.backend!r}"


def check_backend(name: str) -> str:
    if name not in ATTENTION_BACKENDS:
        raise ValueError(f"attention backend {name!r} unknown (choose from {ATTENTION_BACKENDS})")
    return name


def set_attention_backend(model: nn.Module, name: str) -> nn.Module:
    """Select the attention kernel of every core of ``model`` (those a parallel layout swapped
    in keep the core they replaced, and use its kernel): 'sdpa' (torch fused / flash on GPU),
    'math' (reference, counted by FlopCounterMode) or 'te' (transformer-engine, see
    te_adapter). Returns ``model``."""
    check_backend(name)
    for module in model.modules():
        if isinstance(module, LocalAttention):
            module.backend = name
    return model
