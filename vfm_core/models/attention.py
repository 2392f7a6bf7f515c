"""Self- and cross-attention modules with per-head QK RMSNorm, GQA and 3D RoPE.

An :class:`Attention` projects, normalises, rotates and (causal, generating) appends to its KV
cache; what attends to what is the :class:`~vfm_core.models.attention_spec.AttentionSpec` its
caller hands in, and how it is computed is its ``core``: a module without parameters,
:class:`~vfm_core.models.local_attention.LocalAttention` on one device, which a parallel layout
swaps for ring / all-to-all attention (``vfm_core.parallel.context``). One module thus serves full
3D attention (DiT), spatial and temporal attention (ST-DiT), packs, causal attention with a KV
cache (the autoregressive family) and cross-attention to the caption.
"""

from __future__ import annotations

import torch
from torch import nn

from vfm_core.models.attention_spec import FULL_ATTENTION, AttentionSpec
from vfm_core.models.layers import RMSNorm, apply_rope_qk
from vfm_core.models.local_attention import LocalAttention


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
        # (q, k, v, spec) -> (B, Hq, N, d); no parameters: a parallel layout swaps it
        self.core: nn.Module = LocalAttention()

    def forward(
        self,
        x: torch.Tensor,  # (B, N, D)
        *,
        spec: AttentionSpec = FULL_ATTENTION,  # keyword: a TP plan prepares the one input x
        context: torch.Tensor | None = None,  # (B, S, Dk) cross-attention keys / values
        rope: torch.Tensor | None = None,  # (N, d/2) RoPE angles of the queries (and keys)
        cache: KVCache | None = None,
    ) -> torch.Tensor:
        """x (B, N, D) -> (B, N, D), attending as ``spec`` says (:class:`AttentionSpec`).
        With ``cache`` (causal generation) the new keys / values are appended to it and the N
        queries are positions ``cache.length .. cache.length + N - 1``."""
        b, n, _ = x.shape
        q, k, v = self.project(x, x if context is None else context)  # (B, H, N | S, d)
        if rope is not None and self.rotary:
            q, k = apply_rope_qk(q, k, rope)  # one rotation, built once for q and k
        if cache is not None:
            k, v = cache.append(k, v)  # (B, Hkv, C + N, d)
        out = self.core(q, k, v, spec)  # (B, Hq, N, d)
        return self.o(out.transpose(1, 2).reshape(b, n, -1))  # (B, N, D)

    def project(
        self, x: torch.Tensor, src: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Queries of x (B, N, D), keys and values of src (B, S, Dk), QK-normalised per head:
        q (B, Hq, N, d), k / v (B, Hkv, S, d). Heads are inferred (-1), so a tensor-parallel
        shard of the projections works unchanged."""
        b, n, _ = x.shape
        d = self.head_dim
        if self.fused:
            rep = self.heads // self.kv_heads
            y = self.qkv(x).view(b, n, -1, rep + 2, d)  # (B, N, Hkv, rep + 2, d)
            q, k, v = y.split((rep, 1, 1), dim=3)  # backward: one cat, not three zero-filled
            q = self.q_norm(q.flatten(2, 3)).transpose(1, 2)  # (B, Hq, N, d)
            k = self.k_norm(k.squeeze(3)).transpose(1, 2)  # (B, Hkv, N, d)
            return q, k, v.squeeze(3).transpose(1, 2)  # v (B, Hkv, N, d)
        q = self.q_norm(self.q(x).view(b, n, -1, d)).transpose(1, 2)  # (B, Hq, N, d)
        k = self.k_norm(self.k(src).view(b, src.shape[1], -1, d)).transpose(1, 2)
        v = self.v(src).view(b, src.shape[1], -1, d).transpose(1, 2)  # (B, Hkv, S, d)
        return q, k, v


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
