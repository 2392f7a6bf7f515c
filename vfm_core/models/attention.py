"""Self- and cross-attention modules with per-head QK RMSNorm, GQA and 3D RoPE.

``layout`` selects which tokens attend to each other without changing the projections, so one module
serves full 3D attention (DiT), spatial attention within a frame and temporal attention across
frames
(ST-DiT). RoPE is applied on the full (t, h, w) grid before regrouping: within a frame the t
rotation is
common to q and k and cancels, so spatial/temporal attention see exactly the 2D/1D relative
encoding.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import nn

from vfm_core.geometry import Grid
from vfm_core.models.flash import grouped_attention
from vfm_core.models.layers import RMSNorm, apply_rope, attention, padding_mask

Layout = Literal["full", "spatial", "temporal"]


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


class KVCache:
    """Keys and values of one attention layer for incremental decoding, preallocated to
    ``max_len`` positions on the first append: (B, Hkv, max_len, d)."""

    def __init__(self, max_len: int):
        self.max_len = max_len
        self.length = 0
        self.k: torch.Tensor | None = None
        self.v: torch.Tensor | None = None

    def append(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """k, v (B, Hkv, N, d) -> all cached keys/values so far (B, Hkv, length + N, d)."""
        n = k.shape[2]
        if self.length + n > self.max_len:
            raise ValueError(f"KV cache: {self.length} + {n} positions exceed its {self.max_len}")
        if self.k is None:
            shape = (*k.shape[:2], self.max_len, k.shape[3])
            self.k, self.v = k.new_empty(shape), v.new_empty(shape)
        assert self.v is not None
        self.k[:, :, self.length : self.length + n] = k
        self.v[:, :, self.length : self.length + n] = v
        self.length += n
        return self.k[:, :, : self.length], self.v[:, :, : self.length]


def fuse_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv_heads: int) -> torch.Tensor:
    """Separate q (Hq*d, C), k and v (Hkv*d, C) weights -> the fused (Hq*d + 2*Hkv*d, C) weight
    whose rows are, per key/value group g, its Hq/Hkv query heads then k_g then v_g (Megatron's
    layout: a column-parallel shard over whole groups is a valid attention shard)."""
    c = q.shape[-1]
    groups = [t.reshape(kv_heads, -1, c) for t in (q, k, v)]  # (Hkv, rows per group, C)
    return torch.cat(groups, dim=1).reshape(-1, c)  # (Hkv * (rep + 2) * d, C)


def split_qkv(
    qkv: torch.Tensor, heads: int, kv_heads: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Inverse of :func:`fuse_qkv`: (q (Hq*d, C), k (Hkv*d, C), v (Hkv*d, C))."""
    c, rep = qkv.shape[-1], heads // kv_heads
    g = qkv.reshape(kv_heads, rep + 2, -1, c)  # (Hkv, rep + 2, d, C)
    return g[:, :rep].reshape(-1, c), g[:, rep].reshape(-1, c), g[:, rep + 1].reshape(-1, c)


class Attention(nn.Module):
    """Multi-head (or grouped-query) attention. Self-attention when ``context`` is None, else
    cross-attention from x (queries) to context (keys/values, width ``context_dim``).
    ``fused`` (self-attention, ``model.fused_proj``): q, k, v as one linear ``qkv`` whose rows
    are :func:`fuse_qkv`'s; a state dict of the other layout is converted on load.
    ``rotary`` False (``model.rope=false``): the RoPE angles a caller passes are not applied
    (the model carries absolute positions in its embedding instead)."""

    def __init__(
        self,
        dim: int,
        heads: int,
        *,
        kv_heads: int | None = None,
        context_dim: int | None = None,
        qk_norm: bool = True,
        eps: float = 1e-6,
        fused: bool = False,
        rotary: bool = True,
    ):
        super().__init__()
        self.head_dim = dim // heads
        self.rotary = rotary
        kv_heads = kv_heads or heads
        self.heads, self.kv_heads = heads, kv_heads
        self.fused = fused
        if fused and context_dim is not None:
            raise ValueError("Attention: fused q/k/v projections are for self-attention only")
        if fused:  # one GEMM, rows per key/value group: [its heads // kv_heads queries, k, v]
            self.qkv = nn.Linear(dim, (heads + 2 * kv_heads) * self.head_dim, bias=False)
        else:
            self.q = nn.Linear(dim, heads * self.head_dim, bias=False)
            self.k = nn.Linear(context_dim or dim, kv_heads * self.head_dim, bias=False)
            self.v = nn.Linear(context_dim or dim, kv_heads * self.head_dim, bias=False)
        self.register_load_state_dict_pre_hook(_convert_qkv_layout)
        self.o = nn.Linear(heads * self.head_dim, dim, bias=False)
        if qk_norm:  # per-head RMSNorm: normalises each head's d-vector, so it commutes with TP
            self.q_norm: nn.Module = RMSNorm(self.head_dim, eps=eps)
            self.k_norm: nn.Module = RMSNorm(self.head_dim, eps=eps)
        else:
            self.q_norm = self.k_norm = nn.Identity()
        # replaceable core (q, k, v, *, grid, layout[, sample_ids]) -> (B, Hq, N, d), set by
        # vfm_core.parallel for context parallelism (ring / all-to-all); None = single device
        self.attn_fn = None

    def forward(
        self,
        x: torch.Tensor,
        *,
        context: torch.Tensor | None = None,
        rope: torch.Tensor | None = None,
        grid: Grid | None = None,
        layout: Layout = "full",
        sample_ids: torch.Tensor | None = None,
        mask: torch.Tensor | None = None,
        causal: bool = False,
        cache: KVCache | None = None,
    ) -> torch.Tensor:
        """x (B, N, D) -> (B, N, D).

        Packed sequences: ``sample_ids`` (N_pack,) int64 group ids of the *whole* pack (self-
        attention under ``ids[:, None] == ids[None, :]``, full layout; the ids encode spatial /
        temporal groups) — handed to ``attn_fn`` as they are, so context parallelism sees the
        whole pack; ``mask`` (N, S) bool, True = attend, for cross-attention to packed captions.
        Unpacked cross-attention masks the zero rows of ``context`` (:func:`padding_mask`): a
        caption of l tokens padded to L attends to its l tokens only.

        Causal self-attention (``causal``; the autoregressive family): token i attends to tokens
        <= i (and, packed, only within its sample). With ``cache`` the new keys/values are
        appended to it and the N queries are positions ``cache.length .. cache.length + N - 1``.
        """
        b, n, _ = x.shape
        src = x if context is None else context  # (B, S, Dk)
        d = self.head_dim
        # heads inferred with -1 so a tensor-parallel shard of the projections works unchanged
        if self.fused:
            rep = self.heads // self.kv_heads
            y = self.qkv(x).view(b, n, -1, rep + 2, d)  # (B, N, Hkv, rep + 2, d)
            q, k, v = y.split((rep, 1, 1), dim=3)  # backward: one cat, not three zero-filled
            q = self.q_norm(q.flatten(2, 3)).transpose(1, 2)  # (B, Hq, N, d)
            k = self.k_norm(k.squeeze(3)).transpose(1, 2)  # (B, Hkv, N, d)
            v = v.squeeze(3).transpose(1, 2)  # (B, Hkv, N, d)
        else:
            q = self.q_norm(self.q(x).view(b, n, -1, d)).transpose(1, 2)  # (B, Hq, N, d)
            k = self.k_norm(self.k(src).view(b, src.shape[1], -1, d)).transpose(1, 2)
            v = self.v(src).view(b, src.shape[1], -1, d).transpose(1, 2)  # (B, Hkv, S, d)
        if rope is not None and self.rotary:
            q, k = apply_rope(q, rope), apply_rope(k, rope)
        if causal:
            if cache is not None:
                k, v = cache.append(k, v)  # (B, Hkv, C + N, d)
            if self.attn_fn is not None:  # context parallel: causal ring over token slices
                out = self.attn_fn(q, k, v, grid=None, layout="causal", sample_ids=sample_ids)
            elif sample_ids is None and k.shape[2] == n:  # no cache before: plain causal
                out = attention(q, k, v, causal=True)  # (B, Hq, N, d)
            elif k.shape[2] == n:  # packed documents: causal within each, no (N, N) mask
                out = grouped_attention(q, k, v, sample_ids, causal=True)  # (B, Hq, N, d)
            else:
                out = attention(q, k, v, causal_mask(n, k.shape[2], sample_ids, q.device))
            return self.o(out.transpose(1, 2).reshape(b, n, -1))  # (B, N, D)
        if sample_ids is not None:
            if self.attn_fn is not None:  # context parallel: ring / all-to-all over the pack
                out = self.attn_fn(q, k, v, grid=None, layout="full", sample_ids=sample_ids)
            else:  # attention within each group of the pack, no (N, N) mask
                out = grouped_attention(q, k, v, sample_ids)  # (B, Hq, N, d)
            return self.o(out.transpose(1, 2).reshape(b, n, -1))  # (B, N, D)
        if context is not None and mask is None:
            pad = padding_mask(context)  # (B, S) or None
            if pad is not None:
                out = attention(q, k, v, pad[:, None, None, :])  # (B, Hq, N, d)
                return self.o(out.transpose(1, 2).reshape(b, n, -1))  # (B, N, D)
        if mask is not None:
            if mask.shape != (n, src.shape[1]):
                raise ValueError(
                    f"attention mask: expected shape ({n}, {src.shape[1]}), got {tuple(mask.shape)}"
                )
            out = attention(q, k, v, mask[None, None])  # (B, Hq, N, d)
            return self.o(out.transpose(1, 2).reshape(b, n, -1))  # (B, N, D)
        if self.attn_fn is not None:
            out = self.attn_fn(q, k, v, grid=grid, layout=layout)  # (B, Hq, N, d)
            return self.o(out.transpose(1, 2).reshape(b, n, -1))  # (B, N, D)
        if layout != "full":
            if grid is None:
                raise ValueError(f"layout {layout!r} needs the token grid")
            q, k, v = (group_tokens(t, grid, layout) for t in (q, k, v))  # (B', H, S', d)
        out = attention(q, k, v)  # (B', Hq, S', d)
        if layout != "full":
            out = ungroup_tokens(out, b, grid, layout)  # (B, Hq, N, d)
        return self.o(out.transpose(1, 2).reshape(b, n, -1))  # (B, N, D)


def _convert_qkv_layout(module: Attention, state_dict: dict, prefix: str, *_args) -> None:
    """load_state_dict pre-hook of :class:`Attention`: a state dict of the other projection
    layout (separate q/k/v or fused qkv weights) is rewritten into the module's."""
    names = [prefix + n for n in ("q.weight", "k.weight", "v.weight")]
    fused = prefix + "qkv.weight"
    if module.fused and fused not in state_dict and all(n in state_dict for n in names):
        parts = [state_dict.pop(n) for n in names]
        state_dict[fused] = fuse_qkv(*parts, module.kv_heads)
    elif not module.fused and fused in state_dict and not any(n in state_dict for n in names):
        parts = split_qkv(state_dict.pop(fused), module.heads, module.kv_heads)
        state_dict.update(zip(names, parts))
