"""Analytic FLOP accounting for the DiT family, the numerator of MFU.

Conventions (the "model FLOPs" of PaLM, Chowdhery et al. 2022, appendix B, and nanoGPT's
``estimate_mfu``, https://github.com/karpathy/nanoGPT/blob/master/model.py):

* **Only matrix multiplications are counted.** A product of an (m×k) by a (k×n) matrix is
  ``2·m·k·n`` FLOPs (one multiply and one add per term of each of the m·n dot products of length k).
  Element-wise work — norms, softmax, activations, RoPE, AdaLN shift/scale/gate, residual adds,
  biases, the sinusoidal timestep features — is *not* counted: it is O(N·D) against the O(N·D²)
  of the matmuls and runs on the vector units, not the tensor cores a peak figure refers to.
* **Attention work is counted** as PaLM does: per sample and layer, ``Q·Kᵀ`` is 2·S·S·D and
  ``P·V`` another 2·S·S·D, so ``4·S²·D`` for S tokens and D = heads·head_dim. Diffusion
  transformers attend bidirectionally, so there is no causal halving. With grouped-query attention
  the keys/values are shared, not smaller in the score computation: scores still cost 4·S²·D.
* **Forward/backward.** For y = x·W the backward needs dx = dy·Wᵀ and dW = xᵀ·dy, each a matmul of
  the forward's size, so a matmul costs 1× forward + 2× backward = 3× forward when its input needs
  a gradient (this is where "6·N FLOPs per token" for N parameters comes from, Kaplan et al. 2020
  §2.1).
  Attention's two batched matmuls obey the same rule (dQ, dK from dS; dP, dV from dO) so attention
  costs 3× its forward in training. When the matmul's input is a leaf that needs no gradient, only
  dW is computed and the matmul costs 2× forward. In this model that is the case for exactly three
  layers, and :func:`train_flops` accounts for it so the count equals what autograd executes
  (``torch.utils.flop_counter.FlopCounterMode``, verified in ``tests/perf/test_flops.py``):

    - the patch embedding (its input is the noisy latent),
    - the cross-attention k/v projections (their input is the frozen text encoder's output),
    - the first layer of the timestep MLP (its input is the fixed sinusoidal features).

* **Model FLOPs, not hardware FLOPs.** Recomputation (activation checkpointing, the recompute inside
  the flash-attention backward) is not counted: MFU uses the FLOPs the *model* needs, so it does not
  reward recomputation (PaLM appendix B calls the other number HFU).

Per-token vs. per-sample terms. Everything that acts on video tokens scales with the token count;
the timestep MLP, the AdaLN modulation MLPs (zero: one D→n·3D projection per block; lora: per
sub-layer D→r→3D plus one shared D→3D per forward) and the final layer's modulation act on the
conditioning vector, once per *sample*. Cross-attention k/v projections act on the text tokens,
once per sample and layer, independent of the video length.

Packed sequences. ``seq_lens=[S₁, S₂, …]`` describes samples packed into one row with a
block-diagonal mask (each sample attends only to itself): linear layers cost Σ Sᵢ, attention
Σ Sᵢ², never (Σ Sᵢ)². ST-DiT attention: spatial attention runs per frame, ``t·(h·w)²``; temporal
attention per spatial location, ``(h·w)·t²``; blocks selected by ``stdit_full_every`` use full
``(t·h·w)²``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import NamedTuple

from vfm_core.config import ModelConfig
from vfm_core.geometry import Grid
from vfm_core.models.dit import block_layouts, build_model, count_params
from vfm_core.perf.memory import mlp_width

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


class _Term(NamedTuple):
    component: str
    flops: float  # forward FLOPs
    input_grad: bool  # does the matmul's input need a gradient (backward 2× fwd) or not (1× fwd)


def matmul_flops(m: float, k: float, n: float) -> float:
    """FLOPs of an (m×k)·(k×n) matrix product: 2·m·k·n."""
    return 2.0 * m * k * n


def default_grid(seq_len: int, *, spatial_to_temporal: float = 4.0) -> Grid:
    """A plausible token grid (t, h, w) with t·h·w == seq_len, for ST-DiT when only N is known.

    Rule: t is the divisor of ``seq_len`` closest, on a log scale, to the t that solves
    ``t · (spatial_to_temporal · t)² = seq_len``, i.e. a clip whose spatial side (in tokens) is
    ``spatial_to_temporal`` times its temporal length; then h ≤ w is the most nearly square
    factorisation of ``seq_len / t``. The default 4 reproduces the paper recipes: 56,320 tokens ->
    (16, 55, 64) against the real (16, 44, 80) grid — same t and frame size, so the same ST-DiT
    attention FLOPs. Only t and h·w matter for the count; pass the real grid when it is known.
    """
    if seq_len <= 0:
        raise ValueError(f"seq_len must be positive, got {seq_len}")
    target = (seq_len / spatial_to_temporal**2) ** (1 / 3)
    divisors = [d for d in range(1, seq_len + 1) if seq_len % d == 0]
    t = min(divisors, key=lambda d: (abs(math.log(d / target)), d))
    s = seq_len // t
    h = max(d for d in range(1, math.isqrt(s) + 1) if s % d == 0)
    return (t, h, s // h)


def _as_grids(seq_lens: list[int], grid: Grid | Sequence[Grid] | None) -> list[Grid]:
    if grid is None:
        return [default_grid(s) for s in seq_lens]
    if len(grid) == 3 and all(isinstance(g, int) for g in grid):
        grids = [tuple(grid)] * len(seq_lens)  # one grid shared by every sample
    else:
        grids = [tuple(g) for g in grid]
    if len(grids) != len(seq_lens):
        raise ValueError(f"{len(grids)} grids for {len(seq_lens)} sequences")
    for s, g in zip(seq_lens, grids, strict=True):
        if len(g) != 3 or math.prod(g) != s:
            raise ValueError(f"grid {g} has {math.prod(g)} tokens, seq_len is {s}")
    return grids  # type: ignore[return-value]


def _terms(
    cfg: ModelConfig,
    seq_lens: list[int] | int,
    grid: Grid | Sequence[Grid] | None,
    text_len: int | None,
) -> list[_Term]:
    """Every matmul of one forward over the samples ``seq_lens`` (one row, batch 1)."""
    lens = [seq_lens] if isinstance(seq_lens, int) else list(seq_lens)
    if not lens or any(s <= 0 for s in lens):
        raise ValueError(f"seq_lens must be positive token counts, got {seq_lens!r}")
    if cfg.arch == "ar":
        return _ar_terms(cfg, lens, text_len)
    needs_grid = cfg.arch == "stdit" and any(
        block_layouts(cfg, i) != ("full",) for i in range(cfg.depth)
    )
    grids = _as_grids(lens, grid) if needs_grid or grid is not None else None
    n = float(sum(lens))  # video tokens
    b = float(len(lens))  # samples
    L = float(cfg.text_len if text_len is None else text_len)
    d = cfg.hidden
    inner = cfg.heads * cfg.head_dim  # query / output width
    kv = cfg.n_kv_heads * cfg.head_dim  # key / value width (GQA)
    patch_dim = cfg.in_channels * math.prod(cfg.patch)

    def attn(layout: str) -> float:
        """Scores Q·Kᵀ and values P·V: 4·S²·inner summed over the attention groups."""
        if layout == "full":
            return sum(4.0 * s * s * inner for s in lens)
        assert grids is not None
        if layout == "spatial":  # per frame: t groups of h·w tokens
            return sum(4.0 * t * (h * w) ** 2 * inner for t, h, w in grids)
        return sum(4.0 * (h * w) * t * t * inner for t, h, w in grids)  # temporal

    terms = [
        _Term("patch_embed", matmul_flops(n, patch_dim + cfg.abs_pos, d), False),  # + positions
        _Term("timestep_embed", matmul_flops(b, cfg.freq_dim, d), False),  # input: sinusoids
        _Term("timestep_embed", matmul_flops(b, d, d), True),
    ]
    if not cfg.cross_attention:  # input: the caption, data
        terms.append(_Term("text_embed", matmul_flops(b, cfg.text_dim, d), False))
    if cfg.adaln == "lora":
        terms.append(_Term("adaln", matmul_flops(b, d, 3 * d), True))  # shared global D -> 3D
    for i in range(cfg.depth):
        layouts = block_layouts(cfg, i)
        # self-attention passes + cross-attention + MLP
        n_sub = len(layouts) + (2 if cfg.cross_attention else 1)
        if cfg.adaln == "zero":
            terms.append(_Term("adaln", matmul_flops(b, d, n_sub * 3 * d), True))
        else:
            r = cfg.adaln_lora_rank
            for _ in range(n_sub):
                terms.append(_Term("adaln", matmul_flops(b, d, r), True))
                terms.append(_Term("adaln", matmul_flops(b, r, 3 * d), True))
        for layout in layouts:  # each pass has its own q, k, v, o
            proj = matmul_flops(n, d, inner) * 2 + matmul_flops(n, d, kv) * 2
            terms.append(_Term("qkvo", proj, True))
            terms.append(_Term("attention", attn(layout), True))
        terms += _cross_terms(cfg, n, b, L)
        terms.append(_Term("mlp", _mlp_flops(cfg, n), True))
    terms.append(_Term("adaln", matmul_flops(b, d, 2 * d), True))  # final-layer modulation
    terms.append(_Term("final", matmul_flops(n, d, patch_dim), True))
    return terms


def _mlp_flops(cfg: ModelConfig, n: float) -> float:
    """One block's MLP on n tokens: GELU (2 matrices) or SwiGLU (3) of width ``mlp_width``."""
    return (3 if cfg.mlp == "swiglu" else 2) * matmul_flops(n, cfg.hidden, mlp_width(cfg))


def _cross_terms(cfg: ModelConfig, n: float, b: float, L: float) -> list[_Term]:
    """One block's cross-attention to the caption (none with pooled text conditioning)."""
    if not cfg.cross_attention:
        return []
    inner, kv = cfg.heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim
    return [
        _Term("cross_qo", matmul_flops(n, cfg.hidden, inner) * 2, True),
        _Term("cross_kv", matmul_flops(b * L, cfg.text_dim, kv) * 2, False),
        _Term("cross_attention", 4.0 * n * L * inner, True),
    ]


def _ar_terms(cfg: ModelConfig, lens: list[int], text_len: int | None) -> list[_Term]:
    """Every matmul of the causal video transformer's forward (models/ar.py). The token
    embedding is a lookup (no matmul); causal attention is counted once, over the lower
    triangle with its diagonal: 4·Dq·S(S+1)/2 per sample of S tokens (a kernel that computes the
    full square and masks it does twice that work, which model FLOPs do not reward)."""
    n, b = float(sum(lens)), float(len(lens))
    L = float(cfg.text_len if text_len is None else text_len)
    d = cfg.hidden
    inner, kv = cfg.heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim
    terms = []
    for _ in range(cfg.depth):
        proj = matmul_flops(n, d, inner) * 2 + matmul_flops(n, d, kv) * 2
        terms.append(_Term("qkvo", proj, True))
        terms.append(_Term("attention", sum(2.0 * s * (s + 1) * inner for s in lens), True))
        terms += _cross_terms(cfg, n, b, L)
        terms.append(_Term("mlp", _mlp_flops(cfg, n), True))
    if not cfg.cross_attention:  # the pooled caption's projection, on the embedding
        terms.append(_Term("text_embed", matmul_flops(b, cfg.text_dim, d), False))
    terms.append(_Term("head", matmul_flops(n, d, cfg.vocab_size), True))
    return terms


def _breakdown(terms: list[_Term], scale: float, train: bool) -> dict[str, float]:
    out = dict.fromkeys(COMPONENTS, 0.0)
    for t in terms:
        out[t.component] += t.flops * scale * ((3.0 if t.input_grad else 2.0) if train else 1.0)
    out["total"] = sum(out[c] for c in COMPONENTS)
    return out


def forward_flops(
    cfg: ModelConfig,
    *,
    seq_lens: list[int] | int,
    grid: Grid | Sequence[Grid] | None = None,
    text_len: int | None = None,
    batch: int = 1,
) -> dict[str, float]:
    """Matmul FLOPs of one forward pass, by component (keys :data:`COMPONENTS` and ``"total"``).

    ``seq_lens``: video tokens per sample, N = (T/pt)(H/ph)(W/pw). An int is one sample; a list is
    samples packed into one row with a block-diagonal attention mask (attention Σ Sᵢ², per-sample
    terms once per sample). ``grid``: the token grid (t, h, w) — one shared by all samples or one
    per sample; needed by ST-DiT spatial/temporal attention, :func:`default_grid` when None.
    ``text_len``: caption tokens (default ``cfg.text_len``). ``batch``: rows of that shape.

    Per block with D = hidden, Dq = heads·head_dim, Dkv = kv_heads·head_dim, N tokens, L text tokens
    (each line 2·m·k·n of its matmul):

    ==================  ================================================================
    qkvo (per pass)     2·N·D·(2·Dq + 2·Dkv)
    attention           4·S²·Dq per attention group of S tokens (full, per frame, per location)
    cross_qo            2·N·D·2·Dq
    cross_kv            2·L·text_dim·2·Dkv              (per sample)
    cross_attention     4·N·L·Dq
    mlp                 2·N·D·inner·{2 GELU, 3 SwiGLU}
    adaln  zero         2·D·(n·3D)                      (per sample; n = passes + 2)
    adaln  lora         n·2·(D·r + r·3D)                (per sample) + 2·D·3D once per forward
    ==================  ================================================================

    plus patch embed 2·N·(C·P)·D, final 2·N·D·(C·P), final modulation 2·D·2D and the timestep MLP
    2·(freq_dim·D + D·D) per sample. Pooled text conditioning (``text_conditioning='pooled'``):
    no cross terms, n = passes + 1, and the caption's projection 2·text_dim·D per sample.
    """
    if batch <= 0:
        raise ValueError(f"batch must be positive, got {batch}")
    return _breakdown(_terms(cfg, seq_lens, grid, text_len), float(batch), train=False)


def train_flops(
    cfg: ModelConfig,
    *,
    seq_lens: list[int] | int,
    grid: Grid | Sequence[Grid] | None = None,
    text_len: int | None = None,
    batch: int = 1,
) -> dict[str, float]:
    """Forward + backward matmul FLOPs of one training step, by component.

    Every matmul whose input needs a gradient costs 3× its forward (forward, dX, dW) — attention
    included (forward Q·Kᵀ and P·V; backward dP, dV, dQ, dK). The three matmuls whose input is a
    leaf without gradient (patch embed, cross-attention k/v on text, first timestep-MLP layer) cost
    2× forward (forward, dW). Arguments as :func:`forward_flops`. The optimiser step is not counted.
    """
    if batch <= 0:
        raise ValueError(f"batch must be positive, got {batch}")
    return _breakdown(_terms(cfg, seq_lens, grid, text_len), float(batch), train=True)


def train_flops_per_token(
    cfg: ModelConfig,
    *,
    seq_len: int,
    grid: Grid | None = None,
    text_len: int | None = None,
) -> float:
    """Training (forward + backward, see :func:`train_flops`) FLOPs per video token for samples of
    ``seq_len`` tokens. Multiply by tokens per second for achieved FLOP/s; it is independent of the
    batch size because every term scales linearly with the number of samples.

    Roughly ``6·P_tok + 12·depth·S·D`` (the PaLM formula, S = attention span) plus the per-sample
    terms amortised over ``seq_len``, where P_tok are the weights applied to every video token.
    """
    return train_flops(cfg, seq_lens=seq_len, grid=grid, text_len=text_len)["total"] / seq_len


def param_count(cfg: ModelConfig) -> int:
    """Parameters of ``build_model(cfg)``, counted on the meta device (no memory, any size)."""
    return count_params(build_model(cfg, device="meta"))
