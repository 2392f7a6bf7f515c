"""Typed configuration for every component, YAML load and ``--section.field=value`` overrides.

Every section is a ``@dataclass(kw_only=True, slots=True)``; the whole run is one :class:`Config`.
Unknown keys, values of the wrong type and values out of range (:func:`validate`) raise
:class:`ConfigError` naming the dotted key, so a typo in a YAML file or on the command line never
silently falls back to a default.

Scalars in YAML files and ``--set`` values follow the YAML 1.2 core schema (:class:`YamlLoader`),
not PyYAML's YAML 1.1: ``1e-3``, ``5E+2`` and ``.5`` are numbers, only ``true`` / ``false`` are
booleans (``train.fp8=off`` is the string ``'off'``), ``010`` is ten.
"""

from __future__ import annotations

import dataclasses
import math
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from vfm_core.errors import UserError


class ConfigError(UserError, ValueError):
    """A user-supplied configuration value is wrong; the message names the key."""


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
    mlp: Literal["gelu", "swiglu"] = "gelu"
    """Feed-forward type."""
    norm: Literal["layer", "rms"] = "layer"
    """Pre-norm type inside blocks."""
    text_dim: int = 384
    """Width of the caption text embeddings fed to cross-attention."""
    text_len: int = 8
    """Number of text tokens per sample."""
    adaln: Literal["zero", "lora"] = "lora"
    """AdaLN-Zero (full per-block modulation MLP) or AdaLN-LoRA (shared + low-rank)."""
    adaln_lora_rank: int = 64
    """Rank r of the per-block AdaLN-LoRA projection D -> r -> 3D."""
    qk_norm: bool = True
    """Per-head RMSNorm on queries and keys."""
    rope_theta: float = 10000.0
    """Base of the factorised 3D rotary embedding."""
    abs_pos: int = 0
    """Width (a multiple of 6) of fixed sin-cos features of each token's absolute (t, h, w) index
    fed to the patch embedding beside the latent values, so it learns an absolute position
    embedding on top of the relative RoPE, as Cosmos' DiT adds one (0 = RoPE only). RoPE alone is
    translation equivariant: a small model then cannot tell which frame is first or where in the
    frame an object starts (diffusion models only)."""
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


DEGREES = ("dp_replicate", "dp_shard", "cp", "tp", "pp")
"""The parallel degrees of a layout (``ParallelConfig`` fields, CLI flags, form fields)."""


@dataclass(kw_only=True, slots=True)
class ParallelConfig:
    dp_replicate: int = 1
    """Replicated data-parallel degree (DDP/HSDP outer)."""
    dp_shard: int = -1
    """FSDP degree (-1 = whatever is left of the world size)."""
    cp: int = 1
    """Context-parallel degree."""
    tp: int = 1
    """Tensor/sequence-parallel degree."""
    pp: int = 1
    """Pipeline-parallel degree."""
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
    pp_schedule: Literal["gpipe", "1f1b", "interleaved_1f1b"] = "1f1b"
    """Pipeline schedule (pp > 1): GPipe, 1F1B, or interleaved 1F1B over virtual stages
    (Narayanan et al. 2021; smaller bubble, more stage-to-stage sends)."""
    pp_virtual_stages: int = 1
    """Pipeline stages per rank (interleaved_1f1b): the depth is cut into pp x this many
    contiguous stages, rank r holding stages r, r + pp, ..."""
    pp_microbatches: int = 0
    """Microbatches per pipeline schedule run (0 = pp, one per stage); each data-parallel rank's
    share of the batch (divided by train.grad_accum) is split into this many."""

    def degrees(self) -> dict[str, int]:
        """The declared degrees (dp_shard may be -1)."""
        return {k: getattr(self, k) for k in DEGREES}

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
    """FP8 GEMMs in the transformer blocks through transformer-engine (Ada/Hopper GPUs): 'auto'
    uses them when they can run and says why not otherwise, 'on' refuses to run without them."""
    out_dir: str = "runs/train"
    """Where metrics.jsonl and checkpoints go."""


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
        """Dotted keys -> values, e.g. ``{"model.hidden": 256}`` (for MLflow params)."""
        out: dict[str, Any] = {}
        for section, values in self.to_dict().items():
            if isinstance(values, dict):
                out.update({f"{section}.{k}": v for k, v in values.items()})
            else:
                out[section] = values
        return out


_BOOL, _INT, _FLOAT = (f"tag:yaml.org,2002:{t}" for t in ("bool", "int", "float"))
_YAML12 = (  # YAML 1.2.2 section 10.3.2, the core schema: (tag, pattern, first characters)
    (_BOOL, r"true|True|TRUE|false|False|FALSE", "tTfF"),
    (_INT, r"[-+]?[0-9]+|0o[0-7]+|0x[0-9a-fA-F]+", "-+0123456789"),
    (
        _FLOAT,
        r"[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?|[-+]?\.(inf|Inf|INF)|\.(nan|NaN|NAN)",
        "-+.0123456789",
    ),
)


def _resolvers(base: dict, *, keep_yaml11: bool) -> dict:
    """``base``'s implicit resolvers with the YAML 1.2 core bool / int / float ones appended;
    the YAML 1.1 ones of those tags dropped unless ``keep_yaml11``."""
    out = {
        ch: [(tag, rx) for tag, rx in arms if keep_yaml11 or tag not in (_BOOL, _INT, _FLOAT)]
        for ch, arms in base.items()
    }
    for tag, pattern, first in _YAML12:
        for ch in first:
            out.setdefault(ch, []).append((tag, re.compile(f"^(?:{pattern})$")))
    return out


class YamlLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` reading plain scalars by the YAML 1.2 core schema (module docstring)."""

    yaml_implicit_resolvers = _resolvers(yaml.SafeLoader.yaml_implicit_resolvers, keep_yaml11=False)

    def construct_yaml12_int(self, node: yaml.ScalarNode) -> int:
        text = str(self.construct_scalar(node))
        if text.startswith(("0o", "0x")):
            return int(text[2:], 8 if text[1] == "o" else 16)
        return int(text)

    def construct_yaml12_bool(self, node: yaml.ScalarNode) -> bool:
        return str(self.construct_scalar(node)).lower() == "true"


YamlLoader.add_constructor(_INT, YamlLoader.construct_yaml12_int)
YamlLoader.add_constructor(_BOOL, YamlLoader.construct_yaml12_bool)


class YamlDumper(yaml.SafeDumper):
    """``yaml.SafeDumper`` that quotes every string a YAML 1.1 or 1.2 reader would take for
    another type (``'1e3'``, ``'off'``), so a saved config reads back the same with either."""

    yaml_implicit_resolvers = _resolvers(yaml.SafeDumper.yaml_implicit_resolvers, keep_yaml11=True)


def parse_yaml(text: str) -> Any:
    """``text`` parsed as YAML with the YAML 1.2 core schema (:class:`YamlLoader`)."""
    return yaml.load(text, Loader=YamlLoader)  # a SafeLoader: no Python objects


def to_dict(obj: Any) -> Any:
    """Dataclass -> plain dict of YAML/JSON-friendly values (tuples become lists)."""
    if dataclasses.is_dataclass(obj):
        return {f.name: to_dict(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, tuple | list):
        return [to_dict(v) for v in obj]
    return obj


def _coerce(value: Any, tp: Any, key: str) -> Any:
    """Check ``value`` against annotation ``tp``; return it converted (list->tuple, int->float)."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        errors = []
        for arm in typing.get_args(tp):
            if arm is type(None):
                if value is None:
                    return None
                continue
            try:
                return _coerce(value, arm, key)
            except ConfigError as e:
                errors.append(str(e))
        raise ConfigError(f"{key}: expected {_name(tp)}, got {value!r}")
    if origin is Literal:
        if value not in typing.get_args(tp):
            choices = ", ".join(repr(c) for c in typing.get_args(tp))
            raise ConfigError(f"{key}: expected one of {choices}, got {value!r}")
        return value
    if origin is tuple:
        args = typing.get_args(tp)
        if len(args) == 2 and args[1] is Ellipsis:  # tuple[X, ...]: any length
            if not isinstance(value, list | tuple):
                raise ConfigError(f"{key}: expected a list, got {value!r}")
            return tuple(_coerce(v, args[0], f"{key}[{i}]") for i, v in enumerate(value))
        if not isinstance(value, list | tuple) or len(value) != len(args):
            raise ConfigError(f"{key}: expected a list of {len(args)} values, got {value!r}")
        return tuple(_coerce(v, a, f"{key}[{i}]") for i, (v, a) in enumerate(zip(value, args)))
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{key}: expected true/false, got {value!r}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{key}: expected an integer, got {value!r}")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(f"{key}: expected a number, got {value!r}")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"{key}: expected a string, got {value!r}")
        return value
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise ConfigError(f"{key}: expected a mapping of fields, got {value!r}")
        return _build(tp, value, key)
    raise ConfigError(f"{key}: unsupported type {tp!r}")  # pragma: no cover - programming error


def _name(tp: Any) -> str:
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def build_settings(cls: type, values: dict[str, Any], *, prefix: str = "") -> Any:
    """Any settings dataclass (the run config's sections, the tokenizer's, curation's) from a
    (partial) mapping: every key known, every value of its field's type (YAML 1.2 numbers,
    lists -> tuples), errors as one :class:`ConfigError` naming ``prefix.key``."""
    return _build(cls, values, prefix)


def _build(cls: type, values: dict[str, Any], prefix: str = "") -> Any:
    """Build dataclass ``cls`` from a (partial) mapping, validating every key and type."""
    hints = _hints(cls)
    known = {f.name for f in dataclasses.fields(cls)}
    kwargs = {}
    for k, v in values.items():
        key = f"{prefix}.{k}" if prefix else str(k)
        if k not in known:
            raise ConfigError(f"{key}: unknown key (known: {', '.join(sorted(known))})")
        kwargs[k] = _coerce(v, hints[k], key)
    return cls(**kwargs)


def merge(cfg: Config, values: dict[str, Any]) -> Config:
    """Return a new Config with the nested mapping ``values`` applied on top of ``cfg``."""
    base = to_dict(cfg)
    for k, v in values.items():
        if isinstance(v, dict) and isinstance(base.get(k), dict):
            unknown = set(v) - set(base[k])
            if unknown:
                name = sorted(unknown)[0]
                raise ConfigError(f"{k}.{name}: unknown key (known: {', '.join(sorted(base[k]))})")
            base[k] = {**base[k], **v}
        else:
            base[k] = v
    return _build(Config, base)


def parse_override(text: str) -> tuple[list[str], Any]:
    """``"model.hidden=512"`` -> (["model", "hidden"], 512); the value is parsed as YAML."""
    if "=" not in text:
        raise ConfigError(f"override {text!r}: expected section.field=value")
    key, raw = text.split("=", 1)
    parts = key.strip().lstrip("-").split(".")
    if len(parts) != 2 or not all(parts):
        raise ConfigError(f"override {text!r}: key must be section.field, e.g. model.hidden=512")
    try:
        value = parse_yaml(raw) if raw.strip() else ""
    except yaml.YAMLError as e:
        raise ConfigError(f"override {text!r}: value is not valid YAML ({e})") from None
    return parts, value


def apply_overrides(cfg: Config, overrides: list[str]) -> Config:
    """Apply ``section.field=value`` strings in order."""
    nested: dict[str, Any] = {}
    for text in overrides:
        (section, name), value = parse_override(text)
        nested.setdefault(section, {})[name] = value
    return merge(cfg, nested)


def load_yaml(path: str | Path, base: Config | None = None) -> Config:
    """Load a YAML run config (sections as top-level keys) on top of ``base``."""
    path = Path(path)
    try:
        data = parse_yaml(path.read_text()) or {}
    except OSError as e:
        raise ConfigError(f"config file {path}: cannot read ({e.strerror})") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"config file {path}: not valid YAML ({e})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path}: expected a mapping of sections")
    try:
        return merge(base or Config(), data)
    except ConfigError as e:
        raise ConfigError(f"config file {path}: {e}") from None


def save_yaml(cfg: Config, path: str | Path) -> None:
    Path(path).write_text(yaml.dump(to_dict(cfg), Dumper=YamlDumper, sort_keys=False))


def _validate_packing(cfg: Config) -> None:
    """``data.max_tokens``: a non-negative pack length, only from shards, divisible by the
    ranks that split a pack's tokens (cp * tp; twice that for causal CP). Whether the
    largest sample fits is checked against the shard index by the shard source."""
    d, p = cfg.data, cfg.parallel
    if d.max_tokens < 0:
        raise ConfigError(f"data.max_tokens: must be >= 0 (0 = no packing), got {d.max_tokens}")
    if not d.max_tokens:
        return
    if d.source != "shards":
        raise ConfigError(
            f"data.max_tokens={d.max_tokens}: packing needs data.source='shards' (got {d.source!r})"
        )
    split, what = p.cp * p.tp, "parallel.cp * parallel.tp"
    if cfg.model.arch == "ar" and p.cp > 1:  # balanced causal chunks: 2 per CP rank
        split, what = 2 * split, "2 x parallel.cp * parallel.tp (two causal chunks per CP rank)"
    if d.max_tokens % split:
        raise ConfigError(
            f"data.max_tokens={d.max_tokens} is not a multiple of {what} = {split} (every pack is "
            "cut into equal token chunks over those ranks)"
        )


def _validate_blend(d: DataConfig) -> None:
    """``data.blend``: entries ``DIR:WEIGHT`` with weights > 0, not with ``data.shards``, only
    from shards. The datasets themselves (index.json, caption width, latent channels) are checked
    against the model by the shard source when it opens them."""
    if not d.blend:
        return
    d.datasets()
    if d.source != "shards":
        raise ConfigError(f"data.blend: needs data.source='shards' (got {d.source!r})")


RANGES: tuple[tuple[str, str], ...] = (
    # (key, allowed values): "> x", ">= x" or "in [lo, hi)" with ( ) open, [ ] closed ends;
    # every element of a tuple field; None (model.kv_heads unset) is not checked
    ("model.in_channels", ">= 1"),
    ("model.patch", ">= 1"),
    ("model.hidden", ">= 1"),
    ("model.depth", ">= 1"),
    ("model.heads", ">= 1"),
    ("model.kv_heads", ">= 1"),
    ("model.mlp_ratio", "> 0"),
    ("model.text_dim", ">= 1"),
    ("model.text_len", ">= 1"),
    ("model.rope_theta", "> 0"),
    ("model.abs_pos", ">= 0"),
    ("model.stdit_full_every", ">= 0"),
    ("model.freq_dim", ">= 2"),
    ("model.norm_eps", "> 0"),
    ("diffusion.sigma_data", "> 0"),
    ("diffusion.p_std", ">= 0"),
    ("diffusion.sigma_min", "> 0"),
    ("diffusion.sigma_max", "> 0"),
    ("diffusion.rho", "> 0"),
    ("diffusion.num_steps", ">= 1"),
    ("diffusion.guidance", ">= 0"),
    ("diffusion.cond_dropout", "in [0, 1]"),
    ("diffusion.logit_std", ">= 0"),
    ("diffusion.shift", "> 0"),
    ("optim.lr", "> 0"),
    ("optim.weight_decay", ">= 0"),
    ("optim.betas", "in [0, 1)"),
    ("optim.eps", "> 0"),
    ("optim.warmup_steps", ">= 0"),
    ("optim.decay_steps", ">= 0"),
    ("optim.min_lr_ratio", "in [0, 1]"),
    ("optim.grad_clip", ">= 0"),
    ("data.batch_size", ">= 1"),
    ("data.num_captions", ">= 1"),
    ("data.seed", "in [0, 2**63)"),
    ("data.num_workers", ">= 0"),
    ("train.steps", ">= 0"),
    ("train.seed", "in [0, 2**63)"),
    ("train.log_every", ">= 1"),
    ("train.ckpt_every", ">= 1"),
    ("train.keep_ckpts", ">= 0"),
    ("train.ema_decay", "in [0, 1)"),
    ("train.grad_accum", ">= 1"),
)
"""The allowed range of every numeric setting, outside of which a value is nonsense (a negative
learning rate, a beta of 1, a zero epsilon); :func:`validate` checks each, and that every float is
finite."""

_RANGE = re.compile(r"^(?:(>=?) (\S+)|in ([\[(])(\S+), (\S+)([\])]))$")


def _bound(text: str) -> float:
    base, _, power = text.partition("**")
    return float(base) ** int(power) if power else float(base)


def _in_range(value: float, rule: str) -> bool:
    m = _RANGE.match(rule)
    assert m is not None, rule  # a typo in RANGES
    op, lo, lo_end, lo2, hi, hi_end = m.groups()
    if op:
        return value > _bound(lo) if op == ">" else value >= _bound(lo)
    lo_ok = value > _bound(lo2) if lo_end == "(" else value >= _bound(lo2)
    hi_ok = value < _bound(hi) if hi_end == ")" else value <= _bound(hi)
    return lo_ok and hi_ok


def _values(cfg: Config, key: str) -> list[tuple[str, Any]]:
    """(key, value) of a dotted key, ``key[i]`` per element of a tuple field."""
    section, name = key.split(".")
    value = getattr(getattr(cfg, section), name)
    if isinstance(value, tuple):
        return [(f"{key}[{i}]", v) for i, v in enumerate(value)]
    return [(key, value)]


def _validate_ranges(cfg: Config) -> None:
    """Every float finite, every key of :data:`RANGES` inside its range."""
    for section in (f.name for f in dataclasses.fields(cfg)):
        if not dataclasses.is_dataclass(getattr(cfg, section)):
            continue  # recipe
        for f in dataclasses.fields(getattr(cfg, section)):
            for k, v in _values(cfg, f"{section}.{f.name}"):
                if isinstance(v, float) and not math.isfinite(v):
                    raise ConfigError(f"{k}: must be a finite number, got {v}")
    for key, rule in RANGES:
        for k, v in _values(cfg, key):
            if v is not None and not _in_range(v, rule):
                raise ConfigError(f"{k}: must be {rule}, got {v}")


def validate(cfg: Config) -> Config:
    """Cross-field checks that a single type cannot express; raises ConfigError naming the key."""
    _validate_ranges(cfg)
    m, d, t = cfg.model, cfg.data, cfg.train
    if m.hidden % m.heads:
        raise ConfigError(f"model.heads: {m.heads} does not divide model.hidden={m.hidden}")
    if m.abs_pos % 6:
        raise ConfigError(
            f"model.abs_pos: must be a multiple of 6 (sin and cos per axis), got {m.abs_pos}"
        )
    if m.head_dim % 2:
        raise ConfigError(f"model.heads: head_dim {m.head_dim} must be even for RoPE")
    if m.heads % m.n_kv_heads:
        raise ConfigError(f"model.kv_heads: {m.kv_heads} does not divide model.heads={m.heads}")
    if m.freq_dim % 2:
        raise ConfigError(
            f"model.freq_dim: must be even (a cosine and a sine per frequency), got {m.freq_dim}"
        )
    if m.arch == "ar":
        if m.vocab_size < 2:
            raise ConfigError(f"model.vocab_size: must be >= 2 for arch 'ar', got {m.vocab_size}")
        if tuple(m.patch) != (1, 1, 1):
            raise ConfigError(
                f"model.patch: arch 'ar' predicts one token per latent cell, needs (1, 1, 1), "
                f"got {tuple(m.patch)}"
            )
    if m.adaln == "lora" and m.adaln_lora_rank <= 0:
        raise ConfigError(f"model.adaln_lora_rank: must be positive, got {m.adaln_lora_rank}")
    for name, size, p in (
        ("latent_frames", d.latent_frames, m.patch[0]),
        ("latent_height", d.latent_height, m.patch[1]),
        ("latent_width", d.latent_width, m.patch[2]),
    ):
        if size <= 0 or size % p:
            raise ConfigError(f"data.{name}: {size} is not a positive multiple of the patch {p}")
    if cfg.diffusion.sigma_max <= cfg.diffusion.sigma_min:
        raise ConfigError(
            f"diffusion.sigma_max: must be > diffusion.sigma_min={cfg.diffusion.sigma_min}, got "
            f"{cfg.diffusion.sigma_max}"
        )
    _validate_blend(d)
    _validate_packing(cfg)
    if t.fp8 == "on" and cfg.parallel.tp > 1:
        raise ConfigError(
            f"train.fp8: 'on' cannot combine with parallel.tp={cfg.parallel.tp} (DTensor tensor "
            "parallelism shards torch linears, not transformer-engine ones); use 'auto' or tp=1"
        )
    return cfg
