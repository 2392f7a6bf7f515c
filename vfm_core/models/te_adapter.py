"""Thin, runtime-selected adapter to transformer-engine fused attention (optional ``gpu`` extra).

transformer-engine cannot be built or imported without CUDA, so it is imported lazily, only when
the ``te`` backend is selected on a CUDA machine. ``auto`` picks TE when it is usable and falls back
to torch SDPA otherwise, saying why (:func:`resolve_attention_backend`).
"""

from __future__ import annotations

import importlib.util
from functools import cache

import torch

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
    b, hq, s, d = q.shape
    mod = _te_module(hq, k.shape[1], d)
    out = mod(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))  # (B, S, Hq*d)
    return out.view(b, s, hq, d).transpose(1, 2)  # (B, Hq, S, d)
