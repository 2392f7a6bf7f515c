"""The parts of the accounting both families share: a matmul term, the block's MLP width and
FLOPs, its cross-attention to the caption, its attention and MLP parameters, and the pooled
caption's projection. Each family adds its own terms (:mod:`vfm_core.families.diffusion`,
:mod:`vfm_core.families.autoregressive`); :mod:`vfm_core.perf.flops` and
:mod:`vfm_core.perf.memory` sum them (their docstrings give the conventions)."""

from __future__ import annotations

from typing import NamedTuple

from vfm_core.config import ModelConfig
from vfm_core.models.layers import swiglu_width

COMPONENTS = (
    "patch_embed",  # per token: C·pt·ph·pw -> D
    "timestep_embed",  # per sample: freq_dim -> D -> D
    "text_embed",  # per sample (pooled text conditioning): the caption's mean token Dt -> D
    "adaln",  # per sample: block modulation (+ AdaLN-LoRA global term) + final-layer modulation
    "qkvo",  # per token: self-attention q, k, v, o projections (every self-attention pass)
    "attention",  # per sample: self-attention scores + weighted values, 4·S²·D (per layout)
    "cross_qo",  # per token: cross-attention q and o projections
    "cross_kv",  # per sample: cross-attention k, v projections of the text tokens
    "cross_attention",  # per token: cross-attention scores + values, 4·N·L·D
    "mlp",  # per token: GELU (2 matrices) or SwiGLU (3 matrices)
    "final",  # per token: final linear D -> C·pt·ph·pw
    "head",  # autoregressive family, per token: output projection D -> vocabulary
)


class Term(NamedTuple):
    """One matmul of a forward pass."""

    component: str  # one of COMPONENTS
    flops: float  # forward FLOPs
    input_grad: bool  # does the matmul's input need a gradient (backward 2× fwd) or not (1× fwd)


def matmul_flops(m: float, k: float, n: float) -> float:
    """FLOPs of an (m×k)·(k×n) matrix product: 2·m·k·n."""
    return 2.0 * m * k * n


def mlp_width(cfg: ModelConfig) -> int:
    """Inner width F of the block MLP (GELU: ratio·D; SwiGLU: the Llama 2/3 rule)."""
    if cfg.mlp == "swiglu":
        return swiglu_width(cfg.hidden, cfg.mlp_ratio)
    return int(cfg.hidden * cfg.mlp_ratio)


def mlp_flops(cfg: ModelConfig, n: float) -> float:
    """One block's MLP on n tokens: GELU (2 matrices) or SwiGLU (3) of width :func:`mlp_width`."""
    return (3 if cfg.mlp == "swiglu" else 2) * matmul_flops(n, cfg.hidden, mlp_width(cfg))


def self_attention_terms(cfg: ModelConfig, n: float, scores: float) -> list[Term]:
    """One self-attention pass on n tokens: q, k, v, o projections and ``scores`` FLOPs."""
    d, inner, kv = cfg.hidden, cfg.heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim
    proj = matmul_flops(n, d, inner) * 2 + matmul_flops(n, d, kv) * 2
    return [Term("qkvo", proj, True), Term("attention", scores, True)]


def cross_terms(cfg: ModelConfig, n: float, b: float, L: float) -> list[Term]:
    """One block's cross-attention to the caption (none with pooled text conditioning)."""
    if not cfg.cross_attention:
        return []
    inner, kv = cfg.heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim
    return [
        Term("cross_qo", matmul_flops(n, cfg.hidden, inner) * 2, True),
        Term("cross_kv", matmul_flops(b * L, cfg.text_dim, kv) * 2, False),
        Term("cross_attention", 4.0 * n * L * inner, True),
    ]


def attention_mlp_params(cfg: ModelConfig, passes: int) -> int:
    """A block's self-attention passes (q, k, v, o, QK norms), cross-attention and MLP."""
    d, hd, dt = cfg.hidden, cfg.head_dim, cfg.text_dim
    dq, dkv = cfg.heads * hd, cfg.n_kv_heads * hd
    qk = 2 * hd if cfg.qk_norm else 0
    cross = 1 if cfg.cross_attention else 0
    total = passes * (d * dq + 2 * d * dkv + dq * d + qk)  # self-attention q, k, v, o (+ QK norm)
    total += cross * (d * dq + 2 * dt * dkv + dq * d + qk)  # cross-attention
    f = mlp_width(cfg)
    bias = f + d if cfg.mlp_bias else 0
    return total + (3 * d * f if cfg.mlp == "swiglu" else d * f + f * d + bias)


def pooled_text_params(cfg: ModelConfig) -> int:
    """The pooled caption's projection Dt -> D (``text_conditioning='pooled'``), else 0."""
    return 0 if cfg.cross_attention else cfg.text_dim * cfg.hidden + cfg.hidden
