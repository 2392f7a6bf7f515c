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

from collections.abc import Sequence

from vfm_core.config import ModelConfig
from vfm_core.families import build_model, family_of
from vfm_core.families.terms import COMPONENTS, Term
from vfm_core.geometry import Grid
from vfm_core.models.dit import count_params


def _terms(
    cfg: ModelConfig,
    seq_lens: list[int] | int,
    grid: Grid | Sequence[Grid] | None,
    text_len: int | None,
) -> list[Term]:
    """Every matmul of one forward over the samples ``seq_lens`` (one row, batch 1), from the
    model's family (:meth:`vfm_core.families.Family.flop_terms`)."""
    lens = [seq_lens] if isinstance(seq_lens, int) else list(seq_lens)
    if not lens or any(s <= 0 for s in lens):
        raise ValueError(f"seq_lens must be positive token counts, got {seq_lens!r}")
    L = float(cfg.text_len if text_len is None else text_len)
    return family_of(cfg).flop_terms(cfg, lens, grid, L)


def _breakdown(terms: list[Term], scale: float, train: bool) -> dict[str, float]:
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
    per sample; needed by ST-DiT spatial/temporal attention (None:
    :func:`~vfm_core.geometry.default_grid`).
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
