"""Per-GPU memory model of DiT training: parameters, gradients, optimiser states and activations.

**Model states**, as the trainer holds them (FSDP2 with a bf16 ``MixedPrecisionPolicy``, AdamW, an
EMA of the weights): fp32 parameters (4 B), fp32 gradients (4 B, reduced in fp32), the two AdamW
moments (4 + 4 B) and the fp32 EMA (4 B) — 20 bytes per parameter this GPU owns, all sharded over
``dp_shard × cp`` (ZeRO-3, Rajbhandari et al. 2020; torchtitan folds CP into the FSDP mesh,
``parallel_dims.py``: ``dp_shard_cp``). Which parameters a GPU owns is counted exactly
(:func:`rank_params`): tensor parallelism splits the attention projections and MLP weights but
not the norms, the AdaLN modulation or the embedding / final layers; a pipeline stage holds its
blocks, the first stage the patch embedding, the last the final layer, and every stage a replica of
the conditioning modules. ``vfm plan --check`` compares this count with the local shard shapes of
the real model built under the layout. While a layer runs, FSDP keeps its all-gathered bf16
parameters (current + prefetched layer) and its unsharded gradient; under a pipeline schedule a
stage keeps its gradients unsharded (fp32) from the first microbatch to the last backward (torch
``PipelineStage``: no reduce-scatter until the last microbatch), while its parameters are
resharded after every forward (no resharding after a backward but the next forward's), so the
peak — the end of a forward, the most microbatches in flight — holds the live layers gathered
as without a pipeline (``vfm plan --check`` traces: 6 B per parameter of the stage had counted a
bf16 copy of the whole stage that is not there then).

**Activations** are the tensors autograd saves for backward. :func:`block_saved_elements` lists them
op by op for the blocks of ``vfm_core.models.dit`` (what the modules actually save, read off the
autograd graph of the real modules; ``tests/perf/test_memory.py`` checks the sum against
:func:`measure_saved_bytes` within 10 % — exact on CPU fp32, within 0.6 % on an H100 in bf16, the
``gpu``-marked test — and ``vfm plan --check`` traces the whole step under each layout):

* every pre-norm saves its input and statistics (LayerNorm: mean + rstd; RMSNorm: rstd), the AdaLN
  ``modulate`` multiply saves the normalised tensor and ``1 + scale``;
* the q/k/v linears save their (shared) input; per-head QK RMSNorm saves its input and rstd, as
  the fused GPU kernel does (``models.layers.RMSNormFunction`` on the CPU, so that a CPU trace
  measures the GPU's memory); RoPE multiplies by a constant rotation (cos + i·sin, one complex
  N × d/2 tensor) and saves only that, once for q and k (per pass, not per sample);
* attention is the flash kind: it saves q, k, v, the output and the fp32 log-sum-exp — never the
  S × S probabilities. That is what the CPU SDPA kernel (``_scaled_dot_product_flash_attention_for_
  cpu``) saves, and what FlashAttention-2/3 and cuDNN attention save on the GPU (Dao 2023, §3.1),
  so one count serves both; the ``math`` backend (full S × S probabilities) is not modelled;
* ST-DiT regroups q, k, v into frames / locations (a copy each, which attention saves instead of the
  RoPE outputs) — the same element count as full attention;
* the ``o`` projection saves the head-merged attention output — a copy in self-attention, a view in
  cross-attention, whose query (a transposed view) makes the kernel write (B, N, H, d) directly;
  the gated residual saves the sub-layer output and the gate; the MLP saves its input, the GELU
  input and output (SwiGLU: the gate, its SiLU, the up projection and their product).

For training on GPUs activations are bf16 (``act_bytes=2``; FSDP2 ``MixedPrecisionPolicy
(param_dtype=bf16)``) with fp32 statistics. Parallel splits follow Korthikanti et al. 2022
("Reducing Activation Recomputation in Large Transformer Models", §4): tensor parallelism divides
the head- and MLP-width tensors by t, sequence parallelism also the hidden-width ones; context
parallelism divides every per-token tensor by cp. Recompute: ``full`` keeps each block's input and
re-runs one block at a time (its activations are the working set); ``selective`` keeps the outputs
of matmuls and attention and recomputes norms, modulation, activations, RoPE and copies (the
op-level policy of torchtitan's ``apply_ac``: save ``mm`` and SDPA outputs).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

import torch

from vfm_core.config import ModelConfig
from vfm_core.families import family_of
from vfm_core.families.terms import attention_mlp_params, mlp_width
from vfm_core.models.dit import block_layouts

Recompute = Literal["none", "selective", "full"]
RECOMPUTE_MODES: tuple[Recompute, ...] = ("none", "selective", "full")
GiB = float(2**30)

PARAM_BYTES, GRAD_BYTES, OPTIM_BYTES, EMA_BYTES = 4.0, 4.0, 8.0, 4.0
"""Sharded fp32 parameter, fp32 gradient, AdamW moments m and v, fp32 EMA (per parameter)."""
STATE_BYTES_PER_PARAM = PARAM_BYTES + GRAD_BYTES + OPTIM_BYTES + EMA_BYTES
FSDP_LIVE_LAYERS = 2
"""All-gathered layers resident at once under FSDP: the running one and the prefetched next."""
FRAMEWORK_OVERHEAD_GIB = 4.0
"""CUDA context (~0.5 GiB), NCCL buffers and cuBLAS/cuDNN workspaces, allocator slack: a fixed
allowance (assumption, not a measured figure; calibrate against ``peak_mem_gb`` of real runs)."""
USABLE_FRACTION = 0.95
"""Fraction of HBM the caching allocator can use before fragmentation makes allocations fail."""


# ---------------------------------------------------------------------------------- parameters
def block_params(cfg: ModelConfig, index: int) -> int:
    """Parameters of block ``index`` of ``build_model(cfg)``: attention and MLP, plus the
    family's norms or modulation (:meth:`vfm_core.families.Family.block_norm_params`)."""
    passes = len(block_layouts(cfg, index))
    sublayers = passes + (1 if cfg.cross_attention else 0) + 1
    return attention_mlp_params(cfg, passes) + family_of(cfg).block_norm_params(cfg, sublayers)


def nonblock_params(cfg: ModelConfig) -> int:
    """Every parameter outside the blocks (:meth:`vfm_core.families.Family.nonblock_params`)."""
    return family_of(cfg).nonblock_params(cfg)


def param_count(cfg: ModelConfig) -> int:
    """All parameters, analytically (equals ``count_params(build_model(cfg))``, tested); ~µs where
    building even a meta-device 28B model takes seconds."""
    return nonblock_params(cfg) + sum(block_params(cfg, i) for i in range(cfg.depth))


def block_param_split(cfg: ModelConfig, index: int) -> tuple[int, int]:
    """(split over tensor-parallel ranks, whole on each) parameters of block ``index``: the
    attention projections and the MLP weights (and column-parallel biases) are split; the
    per-head QK norms, the AdaLN modulation, RMSNorm weights and row-parallel biases are not
    (``vfm_core.parallel.parallelize._tp_plan``)."""
    d, hd, dt = cfg.hidden, cfg.head_dim, cfg.text_dim
    dq, dkv = cfg.heads * hd, cfg.n_kv_heads * hd
    passes = len(block_layouts(cfg, index))
    cross = 1 if cfg.cross_attention else 0
    split = passes * (2 * d * dq + 2 * d * dkv) + cross * (2 * d * dq + 2 * dt * dkv)
    f = mlp_width(cfg)
    if cfg.mlp == "swiglu":
        split += 3 * d * f
    else:  # fc1's bias is split, fc2's stays whole
        split += 2 * d * f + (f if cfg.mlp_bias else 0)
    return split, block_params(cfg, index) - split


def rank_params(
    cfg: ModelConfig, *, tp: int = 1, pp: int = 1, vpp: int = 1, rank: int = 0
) -> float:
    """Parameters one GPU of pipeline rank ``rank`` owns before FSDP sharding: its stages'
    blocks (tensor-parallel parts / tp), every stage's conditioning replica (timestep MLP,
    AdaLN-LoRA global term), the first stage's input embedding and the last stage's output layer
    (the causal video transformer: token embedding and head split over the vocabulary)."""
    from vfm_core.parallel.pipeline import stage_blocks

    stages, family = pp * vpp, family_of(cfg)
    total = 0.0
    for stage in range(rank, stages, pp):
        for i in map(int, stage_blocks(cfg.depth, stages, stage)):
            split, whole = block_param_split(cfg, i)
            total += split / tp + whole
        total += family.stage_nonblock_params(cfg, stage=stage, stages=stages, tp=tp)
    return total


def busiest_rank_params(cfg: ModelConfig, *, tp: int = 1, pp: int = 1, vpp: int = 1) -> float:
    """:func:`rank_params` of the pipeline rank that owns the most."""
    return max(rank_params(cfg, tp=tp, pp=pp, vpp=vpp, rank=r) for r in range(pp))


# ---------------------------------------------------------------------------------- activations
@dataclass(kw_only=True, slots=True, frozen=True)
class Split:
    """How one rank's share of a micro-batch is cut (Korthikanti et al. 2022 §4)."""

    tp: int = 1
    """Tensor-parallel degree: divides head-width and MLP-width tensors."""
    sp: bool = False
    """Sequence parallelism: hidden-width tensors are also divided by tp."""
    cp: int = 1
    """Context-parallel degree: divides every per-token tensor."""
    ring: bool = True
    """Context parallelism of full attention by the ring (else all-to-all): under selective
    recompute the ring keeps every step's kernel output and LSE (module docstring)."""


def block_saved_elements(
    cfg: ModelConfig,
    index: int,
    *,
    micro_batch: int,
    seq_len: int,
    text_len: int | None = None,
    split: Split = Split(),
    recompute: Recompute = "none",
) -> dict[str, float]:
    """Elements autograd saves in block ``index`` for one micro-batch, split by kind:
    ``act`` (activation dtype), ``stat`` (fp32 statistics: norm mean/rstd, attention LSE) and
    ``const`` (RoPE cos/sin, in the activation dtype on CPU fp32, fp32 on GPU — counted as act).

    Per token (before splits), D = hidden, Dq = heads·hd, Dkv = kv_heads·hd, F = MLP width, with
    QK norm (the recipes' default):

    ======================  ==========================================================
    self-attention pass     4·D (norm in/out, linear in, output)  +  4·Dq + 3·Dkv
    cross-attention         4·D  +  3·Dq         + per sample 3·L·Dkv (k, k-out, v)
    MLP                     4·D  +  2·F (GELU) or 4·F (SwiGLU)
    ======================  ==========================================================

    The QK RMSNorm saves its input and rstd (the fused kernel: ``FusedRmsNormBackward0`` on
    CUDA, measured on an H100 with torch 2.11; ``RMSNormFunction`` elsewhere).

    That is 22·D + 2·F = 30·D for a GELU DiT block (close to Korthikanti et al.'s 34·s·b·h for
    a GPT block, by coincidence: theirs counts bytes, without flash attention).
    """
    L = cfg.text_len if text_len is None else text_len
    if recompute == "full":  # checkpoint boundary: the block input only
        tok = micro_batch * seq_len / split.cp  # tokens of this rank
        return {"act": tok * cfg.hidden / (split.tp if split.sp else 1), "stat": 0.0}
    saved = _selective_saved_elements if recompute == "selective" else _all_saved_elements
    return saved(cfg, index, micro_batch=micro_batch, seq_len=seq_len, text_len=L, split=split)


def _selective_saved_elements(
    cfg: ModelConfig, index: int, *, micro_batch: int, seq_len: int, text_len: int, split: Split
) -> dict[str, float]:
    """:func:`block_saved_elements` under selective recompute: the outputs of the matmuls and
    of attention, and the block input."""
    d, hd = cfg.hidden, cfg.head_dim
    dq, dkv = cfg.heads * hd, cfg.n_kv_heads * hd
    f = mlp_width(cfg)
    L, b, t = text_len, micro_batch, split.tp
    tok = b * seq_len / split.cp  # tokens of this rank
    dsplit = split.tp if split.sp else 1
    passes = len(block_layouts(cfg, index))
    cross = 1 if cfg.cross_attention else 0  # pooled text conditioning: no cross-attention
    # the row-parallel o / fc2 matmuls' outputs are whole-width partial sums (their
    # reduce-scatter / all-reduce comes after): d per token, not d / tp
    act = tok * d / dsplit  # block input
    act += passes * tok * ((2 * dq + 2 * dkv) / t + d)  # q, k, v, attn out; o out
    # cross-attention q, out, o; text k, v
    act += cross * (tok * (2 * dq / t + d) + b * L * 2 * dkv / t)
    act += tok * ((2 if cfg.mlp == "swiglu" else 1) * f / t + d)  # fc1 (w1, w3); fc2
    stat = (passes + cross) * tok * cfg.heads / t  # LSE
    ring = sum(lo == "full" for lo in block_layouts(cfg, index)) if split.ring else 0
    if split.cp > 1 and ring:  # every ring step's kernel output + LSE, not only the merge
        act += ring * (split.cp - 1) * tok * dq / t
        stat += ring * (split.cp - 1) * tok * cfg.heads / t
    return {"act": act, "stat": stat}


def _all_saved_elements(
    cfg: ModelConfig, index: int, *, micro_batch: int, seq_len: int, text_len: int, split: Split
) -> dict[str, float]:
    """:func:`block_saved_elements` without recompute: everything the modules save."""
    d, hd = cfg.hidden, cfg.head_dim
    dq, dkv = cfg.heads * hd, cfg.n_kv_heads * hd
    h, hkv = cfg.heads, cfg.n_kv_heads
    f = mlp_width(cfg)
    L, b, t = text_len, micro_batch, split.tp
    tok = b * seq_len / split.cp  # tokens of this rank
    rows = seq_len / split.cp  # RoPE tables are per position, shared by the samples
    dsplit = split.tp if split.sp else 1
    norm_stats = 2 if cfg.norm == "layer" else 1
    passes = len(block_layouts(cfg, index))
    cross = 1 if cfg.cross_attention else 0  # pooled text conditioning: no cross-attention
    n = passes + cross + 1
    qk = cfg.qk_norm
    # norm input, modulate (norm output), gated output: sequence-split under SP; the linear input
    # is the all-gathered sequence (torch's SP saves it gathered, Megatron's re-gathers it)
    per_tok_d = 3 * d * n / dsplit + d * n
    self_heads = (4 * dq + 3 * dkv) if qk else (3 * dq + 2 * dkv)  # QK norm: + its inputs
    cross_heads = 3 * dq if qk else 2 * dq  # output keeps the query's layout: no copy
    mlp_inner = (4 if cfg.mlp == "swiglu" else 2) * f
    act = tok * per_tok_d
    act += tok * (passes * self_heads + cross * cross_heads + mlp_inner) / t
    act += cross * b * L * (3 if qk else 2) * dkv / t  # cross-attention k, v of the text
    act += passes * rows * hd  # RoPE: one (N, hd/2) complex rotation, saved once for q and k
    # per-sample conditioning: SiLU(emb), (1 + scale), gate storage, LoRA rank activations
    if cfg.adaln == "zero":
        act += b * (d + n * d + 3 * n * d)
    else:
        act += b * (d + n * (cfg.adaln_lora_rank + d + 3 * d))
    stat = tok * n * norm_stats / dsplit  # norm statistics
    stat += tok * (passes * ((h + hkv) if qk else 0) + cross * (h if qk else 0)) / t  # QK rstd
    stat += tok * (passes + cross) * h / t  # attention LSE
    stat += cross * (b * L * hkv / t) if qk else 0.0  # text k-norm rstd
    return {"act": act, "stat": stat}


def model_saved_bytes(
    cfg: ModelConfig,
    *,
    micro_batch: int,
    seq_len: int,
    text_len: int | None = None,
    act_bytes: int = 4,
    stat_bytes: int = 4,
) -> dict[str, float]:
    """Predicted saved-tensor bytes of one whole forward of ``build_model(cfg)`` (no parallelism,
    no recompute), by part: ``blocks``, ``outside`` (patch embedding, timestep MLP, final layer,
    text) and ``total``. This is what :func:`measure_saved_bytes` measures on CPU (fp32: both
    byte widths 4) and, with ``act_bytes=2``, on a GPU in bf16 (cuDNN / flash
    SDPA save the same q, k, v, output and LSE as the CPU kernel)."""
    d = cfg.hidden
    L = cfg.text_len if text_len is None else text_len
    b, n = micro_batch, micro_batch * seq_len
    blocks = 0.0
    for i in range(cfg.depth):
        e = block_saved_elements(cfg, i, micro_batch=b, seq_len=seq_len, text_len=L)
        blocks += e["act"] * act_bytes + e["stat"] * stat_bytes
    patch_dim = cfg.in_channels * math.prod(cfg.patch)
    # patch-embed input (with the position features); final norm input, output, linear input
    out = n * (patch_dim + cfg.abs_pos) + n * 3 * d
    # timestep features, MLP hidden + its SiLU, emb, final SiLU(emb), final (1 + scale)
    out += b * (cfg.freq_dim + 5 * d + (d if cfg.adaln == "lora" else 0))  # + global SiLU(emb)
    if cfg.cross_attention:
        out += b * L * cfg.text_dim  # the text embeddings (saved by every cross-attention k, v)
    else:
        out += b * cfg.text_dim  # the pooled caption (saved by its projection)
    stats = n * (2 if cfg.norm == "layer" else 1)
    outside = out * act_bytes + stats * stat_bytes
    return {"blocks": blocks, "outside": outside, "total": blocks + outside}


def measure_saved_bytes(fn: Callable[[], torch.Tensor], params: Iterable[torch.Tensor]) -> int:
    """Bytes of the distinct storages autograd saves while ``fn()`` runs, excluding ``params``.

    Counted with ``torch.autograd.graph.saved_tensors_hooks``; each storage is counted once by its
    data pointer, so views (transposes, chunks, reshapes) of a tensor already saved add nothing —
    what backward actually keeps alive."""
    skip = {p.untyped_storage().data_ptr() for p in params}
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        st = t.untyped_storage()
        if st.data_ptr() not in skip:
            seen.setdefault(st.data_ptr(), st.nbytes())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn()
    del out
    return sum(seen.values())


def stage_saved_bytes(
    cfg: ModelConfig,
    layers: range,
    *,
    micro_batch: int,
    seq_len: int,
    text_len: int | None = None,
    split: Split = Split(),
    recompute: Recompute = "none",
    act_bytes: int = 2,
    kinds: Sequence[tuple[str, ...]] | None = None,
) -> float:
    """Saved bytes of ``layers`` for one micro-batch on the GPU (bf16;
    blocks of equal layout are computed once; ``kinds``: the precomputed ``block_layouts`` of every
    block, to skip recomputing them)."""
    counts: dict[tuple[str, ...], tuple[int, int]] = {}
    for i in layers:
        key = kinds[i] if kinds is not None else block_layouts(cfg, i)
        n, first = counts.get(key, (0, i))
        counts[key] = (n + 1, first)
    total = 0.0
    for n, i in counts.values():
        e = block_saved_elements(
            cfg,
            i,
            micro_batch=micro_batch,
            seq_len=seq_len,
            text_len=text_len,
            split=split,
            recompute=recompute,
        )
        total += n * (e["act"] * act_bytes + e["stat"] * 4)
    return total


# ---------------------------------------------------------------------------------- per GPU
@dataclass(kw_only=True, slots=True, frozen=True)
class MemoryEstimate:
    """Per-GPU memory of one layout, GiB (the busiest rank: the first pipeline stage)."""

    params_gib: float
    """fp32 parameter shards (FSDP2's sharded parameters; the optimizer updates these)."""
    grads_gib: float
    """fp32 gradient shards."""
    optimizer_gib: float
    """AdamW moments m and v."""
    ema_gib: float
    """The EMA of the weights (sharded like the parameters; 0 without EMA)."""
    fsdp_buffers_gib: float
    """All-gathered bf16 parameters and unsharded gradients of the live layers (under a
    pipeline: of the whole stage, held through the schedule)."""
    activations_gib: float
    overhead_gib: float
    total_gib: float
    capacity_gib: float
    """Usable HBM: datasheet capacity × USABLE_FRACTION."""

    @property
    def fits(self) -> bool:
        return self.total_gib <= self.capacity_gib

    @property
    def margin_gib(self) -> float:
        """Headroom (negative: out of memory by that much)."""
        return self.capacity_gib - self.total_gib


def in_flight_microbatches(pp: int, vpp: int, microbatches: int) -> float:
    """Micro-batches of stage activations the first GPU holds at its peak. 1F1B: min(p, m)
    (Narayanan et al. 2021 §2.2); interleaved (vpp = v > 1): (v-1)·r + 2·(p-1) warm-up chunk
    forwards and the first steady-state one, each 1/v of the GPU's blocks, with r = m / rounds
    micro-batches per round — p + (p-1)/v for r = p (Korthikanti et al. 2022 §4.2.3; torch
    ``ScheduleInterleaved1F1B``, ``_get_warmup_ops``); at most all m."""
    p, v, m = pp, vpp, microbatches
    if p == 1:
        return 1.0
    if v == 1:
        return float(min(p, m))
    per_round = m // max(1, m // p)
    return min(m * v, (v - 1) * per_round + 2 * (p - 1) + 1) / v


def estimate_memory(
    cfg: ModelConfig,
    *,
    seq_len: int,
    hbm_gb: float,
    micro_batch: int = 1,
    tp: int = 1,
    sp: bool = False,
    cp: int = 1,
    pp: int = 1,
    dp_shard: int = 1,
    microbatches: int = 1,
    vpp: int = 1,
    recompute: Recompute = "none",
    ema: bool = True,
    text_len: int | None = None,
    act_bytes: int = 2,
    overhead_gib: float = FRAMEWORK_OVERHEAD_GIB,
    owned: float | None = None,
    layer_params: int | None = None,
    kinds: Sequence[tuple[str, ...]] | None = None,
    saved: tuple[float, float] | None = None,
    trained: float | None = None,
) -> MemoryEstimate:
    """Memory of the busiest GPU (the first pipeline stage's activations) for the given layout.

    States: the parameters the busiest pipeline rank owns (:func:`busiest_rank_params`; or
    ``owned``), 20 B each with EMA (module docstring), sharded over ``dp_shard·cp`` (replicated
    when that is 1: plain DDP). Activations: the stage's ``depth/pp`` blocks × in-flight
    micro-batches (:func:`in_flight_microbatches`: 1F1B or interleaved over ``vpp`` virtual
    stages), plus for ``full`` recompute one block's complete activations (re-run during
    backward; block-wise full recompute, ``parallel.activation_checkpointing_blocks``, comes in
    through ``saved``: the planner mixes the full and selective stage bytes). ``hbm_gb`` is read
    as GiB (an "80 GB" H100 shows 79.6 GiB). ``owned``,
    ``layer_params`` (largest block) and ``kinds`` (block layouts) may be passed precomputed —
    the planner evaluates thousands of layouts per query — and so may ``saved``: (the stage's
    saved bytes per micro-batch under ``recompute``, one block's saved bytes without recompute).
    ``trained``: of the ``owned`` parameters, those that train (gradients, AdamW moments, EMA;
    LoRA: the adapters); None: all of them.
    """
    shard = dp_shard * cp
    if owned is None:
        owned = busiest_rank_params(cfg, tp=tp, pp=pp, vpp=vpp)
    learn = (owned if trained is None else trained) / shard
    params_gib, grads_gib, optim_gib, ema_gib = _states_gib(owned / shard, learn, ema=ema)
    if layer_params is None:
        layer_params = max(block_params(cfg, i) for i in range(cfg.depth))
    fsdp = _fsdp_buffers_gib(
        owned=owned, layer=layer_params / tp, shard=shard, pp=pp, learn=learn * shard / owned
    )
    if saved is None:
        split = Split(tp=tp, sp=sp, cp=cp)
        kw = dict(micro_batch=micro_batch, seq_len=seq_len, text_len=text_len, split=split)
        kw |= dict(kinds=kinds, act_bytes=act_bytes)
        stage = stage_saved_bytes(cfg, range(cfg.depth // pp), recompute=recompute, **kw)
        saved = (stage, stage_saved_bytes(cfg, range(1), **kw))
    in_flight = in_flight_microbatches(pp, vpp, microbatches)
    stage, block = saved
    act = stage * in_flight
    if recompute == "full":  # one block's activations live again during its backward
        act += block
    # patch embedding / final layer / text: small, held once per in-flight micro-batch
    d = cfg.hidden
    act += in_flight * micro_batch * seq_len / cp * (4 * d / (tp if sp else 1)) * act_bytes
    tokens = in_flight * micro_batch * seq_len  # the output beyond the blocks (AR: the logits)
    act += family_of(cfg).output_activation_bytes(cfg, tokens=tokens, tp=tp, act_bytes=act_bytes)
    act_gib = act / GiB
    total = params_gib + grads_gib + optim_gib + ema_gib + fsdp + act_gib + overhead_gib
    return MemoryEstimate(
        params_gib=params_gib,
        grads_gib=grads_gib,
        optimizer_gib=optim_gib,
        ema_gib=ema_gib,
        fsdp_buffers_gib=fsdp,
        activations_gib=act_gib,
        overhead_gib=overhead_gib,
        total_gib=total,
        capacity_gib=hbm_gb * USABLE_FRACTION,
    )


def _states_gib(held: float, learn: float, *, ema: bool) -> tuple[float, float, float, float]:
    """(parameters, gradients, AdamW moments, EMA) GiB of ``held`` parameters of which ``learn``
    train."""
    ema_gib = learn * EMA_BYTES / GiB if ema else 0.0
    return held * PARAM_BYTES / GiB, learn * GRAD_BYTES / GiB, learn * OPTIM_BYTES / GiB, ema_gib


def _fsdp_buffers_gib(
    *, owned: float, layer: float, shard: int, pp: int, learn: float = 1.0
) -> float:
    """All-gathered bf16 parameters and unsharded gradients of the live layers (``layer``: one
    block's parameters on this TP rank; ``learn``: the share of them that trains), GiB."""
    if shard == 1:
        return 0.0
    if pp > 1:  # the stage's fp32 gradients stay unsharded all step; its parameters are
        # resharded after each forward (gathered again in the backward), so at the peak (a
        # forward's end, most microbatches in flight) the live layers are gathered as without PP
        return (owned * learn * 4 + layer * 2 * FSDP_LIVE_LAYERS) / GiB
    return layer * (2 * FSDP_LIVE_LAYERS + 2 * learn) / GiB
