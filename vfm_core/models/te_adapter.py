"""Thin, runtime-selected adapter to transformer-engine fused attention (optional ``gpu`` extra).

transformer-engine cannot be built or imported without CUDA, so it is imported lazily, only when
the ``te`` backend is selected on a CUDA machine. ``auto`` picks TE when it is usable and falls back
to torch SDPA otherwise, saying why (:func:`resolve_attention_backend`).

Under context parallelism the same backend runs TE's own context-parallel attention
(:func:`te_context_attention`, its P2P ring with fused kernels) for full attention and for
causal attention over the balanced zigzag placement (TE's own: rank r holds chunks r and
2·cp-1-r); :func:`context_backend` says which implementation a ring call takes and why.
"""

from __future__ import annotations

import importlib.util
from functools import cache

import torch
import torch.distributed as dist

from vfm_core.config import ConfigError


def te_status() -> tuple[bool, str]:
    """(usable, reason) for transformer-engine fused attention on this machine."""
    if not torch.cuda.is_available():
        return False, "no CUDA device"
    if importlib.util.find_spec("transformer_engine") is None:
        return False, "transformer-engine not installed (pip install -e '.[gpu]')"
    try:
        import transformer_engine.pytorch  # noqa: F401
    except Exception as e:  # TE raises assorted errors when cuDNN/CUDA libraries are missing
        return False, f"transformer-engine failed to import ({type(e).__name__}: {e})"
    return True, "transformer-engine fused attention"


def resolve_attention_backend(requested: str) -> tuple[str, str]:
    """Map a configured backend ('auto', 'sdpa', 'math', 'te') to the one that will run."""
    if requested in ("sdpa", "math"):
        return requested, f"{requested} (configured)"
    usable, reason = te_status()
    if requested == "te":
        if not usable:
            raise ConfigError(f"model.attn_backend: 'te' requested but unusable: {reason}")
        return "te", reason
    if requested != "auto":
        raise ConfigError(f"model.attn_backend: unknown backend {requested!r}")
    return ("te", reason) if usable else ("sdpa", f"sdpa (transformer-engine unusable: {reason})")


@cache
def _te_module(heads: int, kv_heads: int, head_dim: int):
    import transformer_engine.pytorch as te

    return te.DotProductAttention(
        heads, head_dim, num_gqa_groups=kv_heads, qkv_format="bshd", attn_mask_type="no_mask"
    )


def te_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """q (B, Hq, S, d), k/v (B, Hkv, S, d) -> (B, Hq, S, d) through TE's fused kernels."""
    return _bshd(_te_module(q.shape[1], k.shape[1], q.shape[3]), q, k, v)


def _bshd(mod, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """q (B, Hq, S, d), k/v (B, Hkv, S, d) through a TE attention module in its (B, S, H, d)
    layout -> (B, Hq, S, d)."""
    b, hq, s, d = q.shape
    out = mod(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))  # (B, S, Hq*d)
    return out.view(b, s, hq, d).transpose(1, 2)


def context_backend(
    q: torch.Tensor, *, backend: str, packed: bool, causal: bool, balanced: bool
) -> tuple[str, str]:
    """(implementation, why) of a context-parallel ring call: ``te`` (TE's context-parallel
    attention) where the attention ``backend`` (the kernel of the replaced attention core) is
    ``te``, the tensors are on a GPU and the case is one TE covers (unpacked; causal only over
    the balanced placement), else ``torch`` (PyTorch's ring / vfm's packed ring,
    :mod:`vfm_core.parallel.ring`)."""
    if backend != "te":
        return "torch", f"attention backend {backend!r}"
    if packed:
        return "torch", "packed sequences (sample ids) run vfm's packed ring"
    if causal and not balanced:
        return "torch", "causal attention over contiguous chunks (TE expects the zigzag)"
    if not q.is_cuda:
        return "torch", "tensors not on a CUDA device"
    return "te", "transformer-engine context-parallel attention (p2p)"


@cache
def _te_cp_module(heads: int, kv_heads: int, head_dim: int, causal: bool, group):
    import transformer_engine.pytorch as te

    mod = te.DotProductAttention(
        heads,
        head_dim,
        num_gqa_groups=kv_heads,
        qkv_format="bshd",
        attn_mask_type="causal" if causal else "no_mask",
    )
    ranks = dist.get_process_group_ranks(group)
    mod.set_context_parallel_group(group, ranks, torch.cuda.Stream(), "p2p")
    return mod


def te_context_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, group, *, causal: bool
) -> torch.Tensor:
    """This rank's chunk q (B, Hq, n, d), k/v (B, Hkv, n, d) -> (B, Hq, n, d): exact attention
    over every rank's chunk of ``group`` through TE's context-parallel fused attention."""
    return _bshd(_te_cp_module(q.shape[1], k.shape[1], q.shape[3], causal, group), q, k, v)
