"""Typed configuration for every component, YAML load and ``--section.field=value`` overrides.

Every section is a ``@dataclass(kw_only=True, slots=True)``; the whole run is one :class:`Config`.
Unknown keys, values of the wrong type and values out of range (:func:`validate`) raise
:class:`ConfigError` naming the dotted key, so a typo in a YAML file or on the command line never
silently falls back to a default.

The typed builder, the YAML 1.2 dialect and :class:`ConfigError` live in
:mod:`vfm_core.config_build`, the range and cross-field checks in :mod:`vfm_core.config_validate`;
both are re-exported here.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Literal

import yaml

from vfm_core.config_build import (  # noqa: F401  (re-exported: ConfigError, build_settings)
    ConfigError,
    YamlDumper,
    build_settings,
    deep_merge,
    dotted,
    flatten,
    override_keys,
    parse_override,
    parse_yaml,
    put,
    read_yaml,
    refuse_disagreement,
    to_dict,
    yaml_problem,
)
from vfm_core.config_fields import bounds
from vfm_core.config_validate import RANGES, validate  # noqa: F401  (re-exported)


@dataclass(frozen=True, kw_only=True, slots=True)
class FamilyTraits:
    """What the torch-free layers (the config checks, the recipes, the forms) know of a model
    family: its name, the ``model.arch`` values it builds and how it trains. The family objects
    (:class:`vfm_core.families.Family`, with torch) take theirs from :data:`FAMILY_TRAITS`."""

    name: str
    """The family's name in forms, recipes and MLflow (``diffusion``, ``autoregressive``)."""
    archs: tuple[str, ...]
    """The ``model.arch`` values whose networks this family builds."""
    discrete: bool
    """Trains on the token ids of a discrete tokenizer (``model.vocab_size`` of them, one per
    latent cell: ``model.patch`` (1, 1, 1)) rather than on continuous latents."""
    causal: bool
    """Predicts each token from the earlier ones only (causal attention): balanced causal
    context parallelism cuts a sequence into two chunks per CP rank."""


FAMILY_TRAITS: dict[str, FamilyTraits] = {
    t.name: t
    for t in (
        FamilyTraits(
            name="diffusion", archs=("dit", "stdit", "llama_dit"), discrete=False, causal=False
        ),
        FamilyTraits(name="autoregressive", archs=("ar",), discrete=True, causal=True),
    )
}
"""Every model family by name: the one table of which family builds each ``model.arch``."""


def arch_family(arch: str) -> FamilyTraits:
    """The family whose networks include ``arch`` (a ``model.arch`` value)."""
    for traits in FAMILY_TRAITS.values():
        if arch in traits.archs:
            return traits
    known = sorted(a for t in FAMILY_TRAITS.values() for a in t.archs)
    raise ConfigError(f"model.arch {arch!r}: expected one of {', '.join(known)}")


@dataclass(kw_only=True, slots=True)
class ModelConfig:
    arch: Literal["dit", "stdit", "llama_dit", "ar"] = "dit"
    """Block family: full-attention DiT, spatial/temporal ST-DiT, Llama DiT (GQA, SwiGLU), or
    ar: the causal video transformer over discrete tokens (autoregressive family)."""
    vocab_size: int = 64000
    """ar only: discrete video tokens (= prod of the tokenizer's FSQ levels)."""
    in_channels: int = 4
    """Latent channels of the tokenizer."""
    patch: tuple[int, int, int] = (1, 2, 2)
    """Patch size over (t, h, w) of the latent grid."""
    hidden: int = 256
    """Model width D."""
    depth: int = 4
    """Number of transformer blocks."""
    heads: int = 4
    """Attention heads; head_dim = hidden // heads."""
    kv_heads: int | None = None
    """Key/value heads for grouped-query attention (None = heads, i.e. multi-head attention)."""
    mlp_ratio: float = 4.0
    """MLP hidden width as a multiple of D (for SwiGLU: of the equivalent GELU MLP, times 2/3)."""
    mlp: Literal["gelu", "gelu_exact", "swiglu"] = "gelu"
    """Feed-forward type: gelu = GELU with the tanh approximation (DiT's), gelu_exact = erf GELU
    (torch's default, nanoGPT's; on CPU torch's erf kernel is faster), swiglu (Llama; the
    autoregressive recipes)."""
    mlp_bias: bool = True
    """Biases in the GELU MLP's two linears (DiT's; false: none, as nanoGPT with ``bias=False``).
    SwiGLU has none either way."""
    fused_proj: bool = False
    """Self-attention's q, k, v as one ``qkv`` linear, one GEMM (nanoGPT's ``c_attn``, DiT's
    timm ``qkv``), its rows interleaved per key/value group so a tensor-parallel shard holds
    whole groups. The same function: a state dict of either layout loads into the other
    (``load_state_dict`` converts it); a DCP resume needs the layout it was saved with. On CPU
    it measured even with the separate projections (SwiGLU's gate/up stay separate: fused in
    TP-shardable pairs they were 3% slower, strided SiLU and an interleaving copy). Memory: a
    saved view of one part (QK norm's input, attention's v) keeps the whole qkv output alive, so
    ST-DiT and GQA models save 1.5-4% more activations than the planner's model (which is exact
    for the separate layout; the same for full-attention multi-head DiTs, measured on CPU)."""
    norm: Literal["layer", "rms"] = "layer"
    """Pre-norm type inside blocks (the autoregressive recipes: rms, Llama; layer there is
    GPT-2's, without bias)."""
    text_dim: int = 384
    """Width of the caption text embeddings fed to cross-attention."""
    text_len: int = 8
    """Number of text tokens per sample."""
    text_conditioning: Literal["cross", "pooled"] = "cross"
    """How the caption conditions the model. cross: cross-attention from the video tokens to its
    tokens in every block. pooled: the mean of its valid tokens, projected to the width, added
    to the timestep embedding (DiT family, like DiT's class embedding) or to every input token's
    embedding (ar); no cross-attention, so ~15% fewer FLOPs at small widths, and the matched
    configuration of class-conditional / unconditional reference models (benchmarks/peers.py)."""
    adaln: Literal["zero", "lora"] = "lora"
    """AdaLN-Zero (full per-block modulation MLP) or AdaLN-LoRA (shared + low-rank)."""
    adaln_lora_rank: int = 64
    """Rank r of the per-block AdaLN-LoRA projection D -> r -> 3D."""
    qk_norm: bool = True
    """Per-head RMSNorm on queries and keys."""
    rope: bool = True
    """Rotate queries and keys of every self-attention by the factorised 3D RoPE (relative
    positions). false: absolute positions only (``abs_pos`` > 0 required), as GPT-2 / nanoGPT's
    learned and DiT's fixed position embeddings: no rotation, ~10% less attention time on CPU;
    the matched configuration of those reference models (benchmarks/peers.py)."""
    rope_theta: float = 10000.0
    """Base of the factorised 3D rotary embedding."""
    abs_pos: int = 0
    """Width (a multiple of 6) of fixed sin-cos features of each token's absolute (t, h, w) index
    fed to the patch embedding beside the latent values, so it learns an absolute position
    embedding on top of the relative RoPE, as Cosmos' DiT adds one (0 = RoPE only). RoPE alone is
    translation equivariant: a small model then cannot tell which frame is first or where in the
    frame an object starts. The autoregressive family (``arch='ar'``) takes any value > 0 as "on":
    it adds a learned projection of the sin-cos of each input's RoPE angles (head_dim features) to
    the token embedding."""
    stdit_full_every: int = 0
    """ST-DiT only: every k-th block uses full 3D attention not spatial+temporal (0 = never)."""
    attn_backend: Literal["auto", "sdpa", "math", "te"] = "auto"
    """Attention kernel: auto = transformer-engine on CUDA when installed, else torch SDPA."""
    freq_dim: int = 256
    """Width of the sinusoidal timestep features."""
    norm_eps: float = 1e-6
    """Epsilon of all normalisations."""

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def n_kv_heads(self) -> int:
        return self.kv_heads or self.heads

    @property
    def cross_attention(self) -> bool:
        """Whether every block attends to the caption's tokens (``text_conditioning='cross'``)."""
        return self.text_conditioning == "cross"

    @property
    def family_name(self) -> str:
        """The name of the family that builds ``arch`` (:data:`FAMILY_TRAITS`)."""
        return arch_family(self.arch).name

    @property
    def discrete(self) -> bool:
        """Whether ``arch``'s family trains on discrete token ids
        (:attr:`FamilyTraits.discrete`)."""
        return arch_family(self.arch).discrete

    @property
    def causal(self) -> bool:
        """Whether ``arch``'s family predicts each token from the earlier ones
        (:attr:`FamilyTraits.causal`)."""
        return arch_family(self.arch).causal


def model_config_mismatch(
    saved: dict[str, Any], now: dict[str, Any], *, now_label: str, ignore: tuple[str, ...] = ()
) -> str | None:
    """None when a checkpoint's recorded model config ``saved`` matches ``now`` (both
    :func:`to_dict` form), else the first differences as ``model.K: checkpoint A vs <now_label>
    B, ...``. A key the checkpoint does not record was added to :class:`ModelConfig` after it was
    written; it counts as its default, which keeps what the model did before the key existed
    (``mlp_bias``, ``fused_proj``), so older checkpoints still load."""
    defaults = {f.name: f.default for f in fields(ModelConfig)}
    diff = []
    for key, value in now.items():
        old = saved[key] if key in saved else to_dict(defaults.get(key))
        if key not in ignore and old != value:
            diff.append(f"model.{key}: checkpoint {old!r} vs {now_label} {value!r}")
    return ", ".join(diff[:4]) or None


@dataclass(kw_only=True, slots=True)
class DiffusionConfig:
    objective: Literal["edm", "rectified_flow"] = "edm"
    """Training objective: EDM (Karras et al. 2022) or rectified flow (velocity prediction on
    x_t = (1 - t) x0 + t noise, logit-normal t; Open-Sora 2, Wan, SD3)."""
    sigma_data: float = 0.5
    """Standard deviation of the (scaled) data, EDM sigma_data."""
    p_mean: float = -1.2
    """Mean of log(sigma) for training noise levels (EDM P_mean)."""
    p_std: float = 1.2
    """Std of log(sigma) for training noise levels (EDM P_std)."""
    sigma_min: float = 0.002
    """Smallest noise level of the sampling schedule."""
    sigma_max: float = 80.0
    """Largest noise level of the sampling schedule."""
    rho: float = 7.0
    """Exponent of the Karras sampling schedule."""
    sampler: Literal["heun", "euler"] = "heun"
    """Deterministic ODE sampler."""
    num_steps: int = 32
    """Sampling steps."""
    guidance: float = 1.0
    """Classifier-free guidance scale (1 = no guidance)."""
    cond_dropout: float = 0.1
    """Probability of dropping the caption during training (enables CFG)."""
    frame_cond: float = 0.0
    """Share of training samples conditioned on their first latent frames (video-to-world,
    image-to-video): those frames stay clean (no noise, no loss) at their own noise level
    ``sigma_min`` while the rest is denoised; ``vfm generate --prompt-video / --prompt-image``
    then continues a clip. 0 = text-to-video only."""
    frame_cond_max: int = 1
    """A conditioned sample keeps its first k latent frames clean, k uniform in 1..this (a
    multiple of ``model.patch[0]``; 1: the first frame, image-to-video)."""
    logit_mean: float = 0.0
    """Rectified flow: mean of logit(t) of the training times (logit-normal)."""
    logit_std: float = 1.0
    """Rectified flow: std of logit(t) of the training times."""
    shift: float = 1.0
    """Rectified flow: resolution shift k, t -> k t / (1 + (k - 1) t), for training and
    sampling (k > 1 spends more steps at high noise, for larger videos)."""


@dataclass(kw_only=True, slots=True)
class OptimConfig:
    lr: float = 3e-4
    """Peak learning rate (AdamW)."""
    weight_decay: float = 0.0
    """Decoupled weight decay."""
    betas: tuple[float, float] = (0.9, 0.99)
    """AdamW betas."""
    eps: float = 1e-8
    """AdamW epsilon."""
    warmup_steps: int = 20
    """Linear warm-up steps."""
    schedule: Literal["constant", "cosine"] = "constant"
    """Shape after warm-up (constant keeps a run resumable to a longer --steps unchanged)."""
    decay_steps: int = 0
    """Cosine horizon in steps, warm-up included (0 = train.steps)."""
    min_lr_ratio: float = 0.1
    """Final LR as a fraction of the peak (cosine)."""
    grad_clip: float = 1.0
    """Max global gradient norm (0 = no clipping)."""
    fused: bool | Literal["auto"] = "auto"
    """torch's fused AdamW kernel for plain (unsharded) parameters: on CPU the step takes 7 ms
    against 39 ms for the ``foreach`` pass at 14M parameters (measured); on a GPU it is one
    kernel launch for all tensors (nanoGPT's choice on CUDA). Same math to rounding, so a run
    follows a slightly different trajectory than with ``foreach``; a resume uses the same kernel
    and stays bit-identical. 'auto' (the default) and true: fused where torch has the kernel (CPU,
    CUDA; ``foreach`` elsewhere); false: the ``foreach`` pass (the demo's documented figures were
    trained with it, so the demo sets it). Sharded (DTensor) parameters always update one tensor
    at a time."""


@dataclass(kw_only=True, slots=True)
class DataConfig:
    source: Literal["synthetic", "shards"] = "synthetic"
    """Where training latents come from: the synthetic blobs or WebDataset shards (``shards``)."""
    batch_size: int = 4
    """Samples per optimizer step over all data-parallel ranks (the global batch; each of the
    dp ranks takes batch_size / dp), so a parallel layout never changes what a run trains on."""
    latent_frames: int = 4
    """Latent frames T per sample."""
    latent_height: int = 16
    """Latent height H per sample."""
    latent_width: int = 16
    """Latent width W per sample."""
    num_captions: int = 8
    """Synthetic source: number of distinct captions / motion classes."""
    clip_start: Literal["first", "random"] = "first"
    """Shards: which frames of a clip longer than a sample a draw trains on: its first frames, or
    a window whose start is drawn from (seed, loader position): another window of the clip each
    epoch, the same ones after a resume."""
    seed: int = 0
    """Seed of the data stream (independent of the model seed)."""
    shards: str = ""
    """Shard directory (local or s3://) with index.json, for ``source='shards'``."""
    blend: str = ""
    """Several shard directories with weights instead of ``shards``: ``DIR:WEIGHT,DIR:WEIGHT``
    (local or s3://; the weight follows the last ':'). Each step comes from one dataset, drawn
    with probability weight / sum from (seed, step) ('' = ``shards`` alone)."""
    tokenizer: str = ""
    """Tokenizer directory for shards without ``latent.npy`` ('' = the shards must hold latents)."""
    num_workers: int = 0
    """Loader reader/decoder threads (never changes the sample order)."""
    max_tokens: int = 0
    """Packed training (``source='shards'``): tokens per pack, each pack holding samples of their
    own native latent sizes (images and videos); ``batch_size`` then counts packs per step (over all
    data-parallel ranks). 0 = no packing (every sample cropped to ``latent_*``)."""

    def datasets(self) -> list[tuple[str, float]]:
        """(directory, weight) of every dataset trained on: ``blend`` parsed, else ``shards``
        with weight 1 ([] when neither is set); a ConfigError names the key."""
        if self.blend and self.shards:
            raise ConfigError(
                "data.blend and data.shards are both set: use one (a blend of one dataset is "
                "data.blend=DIR:1)"
            )
        if not self.blend:
            return [(self.shards, 1.0)] if self.shards else []
        return parse_blend(self.blend)


def parse_blend(text: str) -> list[tuple[str, float]]:
    """``"DIR_A:0.7,s3://b/x:0.3"`` -> [("DIR_A", 0.7), ("s3://b/x", 0.3)]: the weight after each
    entry's last ':', a finite number > 0; every directory once."""
    out: list[tuple[str, float]] = []
    for entry in (e.strip() for e in text.split(",")):
        url, _, raw = entry.rpartition(":")
        url = url.strip()
        try:
            weight = float(raw)
        except ValueError:
            weight = None
        if not url or weight is None:
            raise ConfigError(
                f"data.blend: entry {entry!r} is not DIR:WEIGHT with a numeric weight after its "
                "last ':' (e.g. data.blend=DIR_A:0.7,DIR_B:0.3)"
            )
        if not math.isfinite(weight) or weight <= 0:
            raise ConfigError(f"data.blend: weight of {url} must be a finite number > 0, got {raw}")
        if url in (u for u, _ in out):
            raise ConfigError(f"data.blend: {url} is listed twice")
        out.append((url, weight))
    return out


@dataclass(kw_only=True, slots=True)
class ParallelDegrees:
    """The five parallel degrees, declared once: :class:`ParallelConfig`'s first fields, the
    resolved degrees :class:`~vfm_core.parallel.dims.ParallelDims` holds, and the source of the
    degree flags and form fields (:mod:`vfm_core.config_fields`)."""

    dp_replicate: int = field(default=1, metadata=bounds(ge=1))
    """Replicated data-parallel degree (DDP/HSDP outer)."""
    dp_shard: int = field(default=-1, metadata=bounds(ge=1, inferred=-1))
    """FSDP degree (-1 = whatever is left of the world size)."""
    cp: int = field(default=1, metadata=bounds(ge=1))
    """Context-parallel degree."""
    tp: int = field(default=1, metadata=bounds(ge=1))
    """Tensor/sequence-parallel degree."""
    pp: int = field(default=1, metadata=bounds(ge=1))
    """Pipeline-parallel degree."""

    def degrees(self) -> dict[str, int]:
        """The degrees by name (a declared dp_shard may be -1)."""
        return {k: getattr(self, k) for k in DEGREES}


DEGREES = tuple(f.name for f in fields(ParallelDegrees))
"""The parallel degrees of a layout: :class:`ParallelDegrees`' fields, in their order."""


@dataclass(kw_only=True, slots=True)
class ParallelConfig(ParallelDegrees):
    sequence_parallel: bool = True
    """With tp > 1, also split the sequence over the TP ranks outside attention / MLP (SP)."""
    cp_mode: Literal["ring", "alltoall", "hybrid"] = "hybrid"
    """Context-parallel attention: ring P2P, all-to-all, or hybrid (all-to-all for ST-DiT
    spatial/temporal, ring for full attention)."""
    activation_checkpointing: bool = False
    """Recompute each block in the backward pass instead of keeping its activations."""
    activation_checkpointing_mode: Literal["full", "selective"] = "full"
    """With activation_checkpointing: ``full`` keeps only each block's input; ``selective`` also
    keeps its matmul and attention outputs and recomputes the element-wise work (the planner's
    ``recompute``; vfm_core.parallel.recompute)."""
    activation_checkpointing_blocks: int = 0
    """With activation_checkpointing in mode ``full``: only the first this many blocks of each
    model part (the whole model, or each pipeline stage) are recomputed whole, the others
    selectively (Megatron's block-wise recompute, ``recompute_num_layers``): memory between the
    two modes for a fraction of full's recompute. 0 = every block."""
    fsdp_unit: Literal["auto", "block", "sublayer"] = "auto"
    """What FSDP2 gathers at once: each transformer block (torchtitan's unit: fewer, larger
    all-gathers, overlapped with compute on a GPU), or each of a block's sub-layers (attention,
    cross-attention, MLP, modulation) with the embedding and output layers resharded after use
    too, so a rank holds its share plus its largest sub-layer gathered (with its gradient and
    reduce-scatter buffer) instead of a whole block. ``auto``: block on CUDA, sub-layer on the
    CPU, where memory, not overlap, is what runs out (dit-7b at depth 2 on 4 CPU ranks: 0.32x
    one process's peak per rank, 0.52x with block units); block under selective recompute, whose
    op cache does not hold sub-layer units' hooks (sub-layer with selective is an error)."""
    pp_schedule: Literal["gpipe", "1f1b", "interleaved_1f1b"] = "1f1b"
    """Pipeline schedule (pp > 1): GPipe, 1F1B, or interleaved 1F1B over virtual stages
    (Narayanan et al. 2021; smaller bubble, more stage-to-stage sends)."""
    pp_virtual_stages: int = 1
    """Pipeline stages per rank (interleaved_1f1b): the depth is cut into pp x this many
    contiguous stages, rank r holding stages r, r + pp, ..."""
    pp_microbatches: int = 0
    """Microbatches per pipeline schedule run (0 = pp, one per stage); each data-parallel rank's
    share of the batch (divided by train.grad_accum) is split into this many."""

    def resolve(self, world_size: int) -> dict[str, int]:
        """The degrees on ``world_size`` ranks, dp_shard=-1 worked out (:func:`resolve_degrees`)."""
        return resolve_degrees(self.degrees(), world_size)

    def data_parallel(self, world_size: int) -> int:
        """Data-parallel ranks (distinct batch slices) of this layout on ``world_size`` ranks."""
        d = self.resolve(world_size)
        return d["dp_replicate"] * d["dp_shard"]


def resolve_degrees(degrees: dict[str, int], world_size: int) -> dict[str, int]:
    """The one place parallel degrees are checked and ``dp_shard=-1`` is resolved: every degree
    an integer >= 1 (dp_shard also -1 = whatever is left), their product the world size.
    Raises :class:`ConfigError` naming the degree and the problem."""
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size <= 0:
        raise ConfigError(f"parallel: world size must be positive, got {world_size!r}")
    out = {k: degrees.get(k, -1 if k == "dp_shard" else 1) for k in DEGREES}
    for name, value in out.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            if name == "dp_shard" and value == -1:
                continue
            allowed = "an integer >= 1 or -1" if name == "dp_shard" else "an integer >= 1"
            raise ConfigError(f"parallel.{name}: must be {allowed}, got {value!r}")
    if out["dp_shard"] == -1:
        others = math.prod(v for k, v in out.items() if k != "dp_shard")
        if world_size % others:
            raise ConfigError(
                f"parallel: dp_replicate*cp*tp*pp = {out['dp_replicate']}*{out['cp']}*"
                f"{out['tp']}*{out['pp']} = {others} does not divide the world size "
                f"{world_size}, so parallel.dp_shard=-1 cannot be inferred"
            )
        out["dp_shard"] = world_size // others
    product = math.prod(out.values())
    if product != world_size:
        shown = "*".join(f"{k}={v}" for k, v in out.items() if v > 1) or "every degree 1"
        raise ConfigError(
            f"parallel: {shown} = {product} ranks, but the world size is {world_size}"
        )
    return out


LORA_TARGETS = ("blocks.*attn*", "blocks.*.mlp.*")
"""The linears LoRA adapts by default: every attention projection (self- and cross-attention
q, k, v, o) and every MLP linear of the blocks."""


@dataclass(kw_only=True, slots=True)
class LoraConfig:
    """Low-rank adapters (Hu et al. 2021, LoRA) on linears of the blocks: ``W x + (alpha / rank)
    B A x`` with A (rank, in) random, B (out, rank) zero, so a run starts as its base model; with
    ``rank`` > 0 only the adapters (and ``train.trainable``) train."""

    rank: int = 0
    """Rank r of each adapter (0 = no LoRA); at most the smaller side of every adapted linear."""
    alpha: float | None = None
    """Scale numerator: the update is (alpha / rank) B A x (None = rank: scale 1)."""
    targets: tuple[str, ...] = LORA_TARGETS
    """Glob patterns (fnmatch) of the ``nn.Linear`` module names to adapt, e.g.
    ``blocks.*.self_attn.*.q``; each must match at least one linear."""

    @property
    def scale(self) -> float:
        return (self.alpha if self.alpha is not None else self.rank) / max(self.rank, 1)


@dataclass(kw_only=True, slots=True)
class TrainConfig:
    steps: int = 100
    """Total optimiser steps."""
    seed: int = 0
    """Seed for weight init, sigma and noise."""
    log_every: int = 1
    """Log metrics every N steps."""
    ckpt_every: int = 50
    """Checkpoint every N steps (and always at the end)."""
    keep_ckpts: int = 2
    """How many recent checkpoints to keep (an old one goes only after a newer one verified;
    0 = keep all)."""
    async_checkpoint: bool = False
    """Write checkpoints in the background (DCP async_save): a step waits only for the copy of
    the state to host memory, at the cost of that much extra host memory while a save runs."""
    ema_decay: float = 0.999
    """EMA decay of the weights (0 = no EMA)."""
    grad_accum: int = 1
    """Gradient accumulation: each data-parallel rank's share of ``data.batch_size`` runs as this
    many sequential forward/backward passes before one optimizer step (same update as one pass
    over the whole batch, a fraction of the activation memory)."""
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """Where to train."""
    dtype: Literal["float32", "bfloat16"] = "float32"
    """Autocast dtype of the forward pass."""
    fp8: Literal["off", "auto", "on"] = "off"
    """FP8 GEMMs in the transformer blocks (Ada/Hopper GPUs) through transformer-engine where
    installed, else torch's ``_scaled_mm`` (tensorwise dynamic scaling): 'auto' uses them when
    they can run and says why not otherwise, 'on' refuses to run without them."""
    compile: Literal["off", "auto", "on"] = "auto"
    """Regional ``torch.compile`` of each transformer block (torchtitan's ``apply_compile``:
    after TP / CP / activation checkpointing, before FSDP): fused element-wise kernels, the same
    parameters and checkpoints. 'auto' compiles where it is faster: on CUDA (launch-bound
    blocks), not on the CPU, where the eager blocks' element-wise kernels are already few-pass and
    compiled ones measured slower or even in steady state (benchmarks/peers.py --compile, one
    thread, width 512: DiT recipe pooled 0.86 vs 0.97 of facebookresearch/DiT eager, AR recipe
    pooled 0.92 vs 0.92 of nanoGPT) after ~20 s of compiling; 'on' everywhere, 'off' never."""
    out_dir: str = "runs/train"
    """Where metrics.jsonl and checkpoints go."""
    init: str | None = None
    """Start from a trained model (``vfm train --init``): a ``vfm train`` run directory (its
    newest intact checkpoint), one of its ``step_*`` folders, or a registered version
    ``models:/NAME@ALIAS`` | ``models:/NAME/VERSION``. Its weights and EMA only: the optimizer,
    schedule, data position and step start new; any layout from any layout. The run may change
    its data, caption length (``model.text_len``), frames and resolution (positions are RoPE
    and fixed sin-cos features of the grid: no learned table to resize). A resumed run
    continues from its own checkpoint and ignores this."""
    trainable: tuple[str, ...] = ()
    """Glob patterns (fnmatch) of the parameter names that train, e.g. ``blocks.*.mlp.*``; the
    others are frozen (no gradient, no optimizer state, not in the run's checkpoints, which hold
    what trains and name the base it came from). Empty: every parameter, or with LoRA only the
    adapters; with LoRA, patterns train beside the adapters."""
    lora: LoraConfig = field(default_factory=LoraConfig)
    """Low-rank adapters (``train.lora.rank`` > 0): :class:`LoraConfig`."""
    init_strict: bool = True
    """With ``init``: the run's parameters and the model's must match one to one (names and
    shapes, the same architecture), else one error lists the differences; false loads the
    parameters that match and names the ones left new and the ones not used."""


@dataclass(kw_only=True, slots=True)
class TrackingConfig:
    mlflow: bool = True
    """Log to MLflow."""
    tracking_uri: str = ""
    """MLflow tracking URI ('' = sqlite store under data/mlflow/)."""
    experiment: str = "vfm"
    """MLflow experiment name."""
    run_name: str = ""
    """MLflow run name ('' = generated)."""
    system_metrics: bool = True
    """Log the machine's CPU, memory, disk, network (and GPU) use to the training run as
    ``system/...`` metrics (every $MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL s, default 10)."""


@dataclass(kw_only=True, slots=True)
class Config:
    recipe: str = "dit-tiny"
    """Name of the preset this config started from."""
    model: ModelConfig = field(default_factory=ModelConfig)
    diffusion: DiffusionConfig = field(default_factory=DiffusionConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    data: DataConfig = field(default_factory=DataConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)

    def to_dict(self) -> dict[str, Any]:
        return to_dict(self)

    def flat(self) -> dict[str, Any]:
        """Dotted keys -> values, e.g. ``{"model.hidden": 256, "train.lora.rank": 0}`` (for
        MLflow params)."""
        return flatten(self.to_dict())


def merge(cfg: Config, values: dict[str, Any]) -> Config:
    """Return a new Config with the nested mapping ``values`` applied on top of ``cfg``."""
    return build_settings(Config, deep_merge(to_dict(cfg), values))


def nested(values: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """``{"data.shards": "s", "train.lora.rank": 8}`` -> ``{"data": {"shards": "s"}, "train":
    {"lora": {"rank": 8}}}`` (for :func:`merge`); a key that is not ``section.field`` is a
    ConfigError naming it."""
    out: dict[str, Any] = {}
    for key, value in values.items():
        parts = key.split(".")
        if len(parts) < 2 or not all(parts):
            raise ConfigError(f"{key}: expected section.field, e.g. train.steps")
        put(out, parts, value)
    return out


def apply_overrides(cfg: Config, overrides: list[str]) -> Config:
    """Apply ``section.field=value`` strings in order."""
    tree: dict[str, Any] = {}
    for text in overrides:
        parts, value = parse_override(text)
        put(tree, parts, value)
    return merge(cfg, tree)


def load_yaml(path: str | Path, base: Config | None = None) -> Config:
    """Load a YAML run config (sections as top-level keys) on top of ``base``."""
    return merge_file(read_yaml(path), path, base or Config())


def merge_file(data: dict[str, Any], path: str | Path, base: Config) -> Config:
    """:func:`merge` of a config file's mapping (:func:`read_yaml`), errors naming the file."""
    try:
        return merge(base, data)
    except ConfigError as e:
        raise ConfigError(f"config file {path}: {e}") from None


def save_yaml(cfg: Config, path: str | Path) -> None:
    Path(path).write_text(yaml.dump(to_dict(cfg), Dumper=YamlDumper, sort_keys=False))
