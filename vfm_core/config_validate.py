"""Range and cross-field checks of a run config (:func:`validate`, :data:`RANGES`).

Values out of range raise :class:`~vfm_core.config_build.ConfigError` naming the dotted key.
"""

from __future__ import annotations

import dataclasses
import math
import operator
import re
from typing import TYPE_CHECKING, Any

from vfm_core.config_build import ConfigError, dotted

if TYPE_CHECKING:  # annotations only: vfm_core.config imports this module
    from vfm_core.config import Config, DataConfig, ModelConfig


def sequence_split(
    model: ModelConfig, *, cp: int, tp: int, prefix: str = "parallel."
) -> tuple[int, str]:
    """(n, how): the trainer cuts every token sequence of ``model`` into n equal chunks over
    ``cp`` context-parallel and ``tp`` sequence-parallel ranks (``vfm_core.parallel.parallelize.
    _split_sequence``), twice as many for a causal family's balanced causal CP (two chunks per CP
    rank, :attr:`~vfm_core.config.FamilyTraits.causal`); ``how`` names the factors above 1
    ("parallel.cp=2 x ..."). The run config's checks and the planner's
    (``vfm_core.perf.layout_rules``) both use it."""
    factors = [(2, "2 causal chunks per CP rank")] if model.causal and cp > 1 else []
    factors += [(cp, f"{prefix}cp={cp}"), (tp, f"{prefix}tp={tp} with sequence parallelism")]
    kept = [(n, text) for n, text in factors if n > 1]
    return math.prod(n for n, _ in kept), " x ".join(text for _, text in kept)


def _validate_sequence_split(cfg: Config) -> None:
    """Unpacked training: a sample's tokens (latent / patch) split evenly over the CP ranks and,
    under sequence parallelism, the TP ranks (packed: ``data.max_tokens``, checked alike)."""
    d, m, p = cfg.data, cfg.model, cfg.parallel
    if d.max_tokens or p.cp < 1 or p.tp < 1:  # bad degrees: named by resolve_degrees
        return
    parts, how = sequence_split(m, cp=p.cp, tp=p.tp if p.sequence_parallel else 1)
    latent = (d.latent_frames, d.latent_height, d.latent_width)
    tokens = math.prod(s // k for s, k in zip(latent, m.patch, strict=True))
    if tokens % parts:
        raise ConfigError(
            f"data.latent_frames/height/width: a {'x'.join(map(str, latent))} latent in "
            f"model.patch={'x'.join(map(str, m.patch))} pieces is {tokens} token"
            f"{'s' * (tokens != 1)}, which cannot be split into {parts} equal chunks ({how}); "
            f"use latent sizes whose token count is a multiple of {parts}"
        )


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
    if p.cp < 1 or p.tp < 1:  # bad degrees: named by resolve_degrees
        return
    split, _ = sequence_split(cfg.model, cp=p.cp, tp=p.tp)
    what = "parallel.cp * parallel.tp"
    if split != p.cp * p.tp:
        what = f"2 x {what} (two causal chunks per CP rank)"
    if d.max_tokens % split:
        raise ConfigError(
            f"data.max_tokens={d.max_tokens} is not a multiple of {what} = {split} (every pack is "
            "cut into equal token chunks over those ranks)"
        )


def _validate_blend(d: DataConfig) -> None:
    """``data.blend``: entries ``DIR:WEIGHT`` with weights > 0, not with ``data.shards``, only
    from shards (as ``data.shards``). The datasets themselves
    (index.json, caption width, latent channels) are checked against the model by the shard
    source when it opens them."""
    # would be ignored: the run trains on synthetic data (data.tokenizer is not: generation
    # decodes the run's latents with it)
    if d.source != "shards":
        for key in ("blend", "shards"):
            if getattr(d, key):
                raise ConfigError(
                    f"data.{key}: needs data.source='shards' (got {d.source!r}, which would "
                    f"train on synthetic data and ignore it); set data.source=shards or drop it"
                )
    if d.blend:
        d.datasets()


RANGES: tuple[tuple[str, str], ...] = (
    # (key, allowed values): "> x", ">= x", "< x", "<= x" or "in [lo, hi)" with ( ) open, [ ]
    # closed ends; every element of a tuple field; None (model.kv_heads unset) is not checked
    ("model.in_channels", ">= 1"),
    ("model.patch", ">= 1"),
    ("model.hidden", ">= 1"),
    ("model.depth", ">= 1"),
    ("model.heads", ">= 1"),
    ("model.kv_heads", ">= 1"),
    ("model.mlp_ratio", "> 0"),
    ("model.text_dim", ">= 1"),
    ("model.text_len", ">= 1"),
    # model sizes: far above any real model (the widest ~2**15, the deepest ~10**3), below sizes
    # that take hours to build or overflow torch's storage size
    ("model.in_channels", "<= 2**20"),
    ("model.hidden", "<= 2**20"),
    ("model.depth", "<= 10000"),
    ("model.mlp_ratio", "<= 1024"),
    ("model.text_dim", "<= 2**20"),
    ("model.text_len", "<= 2**20"),
    ("model.rope_theta", "> 0"),
    ("model.abs_pos", ">= 0"),
    ("model.stdit_full_every", ">= 0"),
    ("model.freq_dim", ">= 2"),
    ("model.norm_eps", "> 0"),
    ("train.lora.rank", ">= 0"),
    ("train.lora.rank", "<= 2**16"),
    ("train.lora.alpha", "> 0"),
    ("diffusion.sigma_data", "> 0"),
    ("diffusion.p_std", ">= 0"),
    ("diffusion.sigma_min", "> 0"),
    ("diffusion.sigma_max", "> 0"),
    ("diffusion.rho", "> 0"),
    ("diffusion.num_steps", ">= 1"),
    ("diffusion.guidance", ">= 0"),
    ("diffusion.cond_dropout", "in [0, 1]"),
    ("diffusion.frame_cond", "in [0, 1]"),
    ("diffusion.frame_cond_max", ">= 1"),
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
learning rate, a beta of 1, a zero epsilon, a model of 10**23 blocks); :func:`validate` checks
each, and that every float is finite."""

_RANGE = re.compile(r"^(?:([<>]=?) (\S+)|in ([\[(])(\S+), (\S+)([\])]))$")
_COMPARE = {">": operator.gt, ">=": operator.ge, "<": operator.lt, "<=": operator.le}


def _bound(text: str) -> float:
    base, _, power = text.partition("**")
    return float(base) ** int(power) if power else float(base)


def _in_range(value: float, rule: str) -> bool:
    m = _RANGE.match(rule)
    assert m is not None, rule  # a typo in RANGES
    op, lo, lo_end, lo2, hi, hi_end = m.groups()
    if op:
        return _COMPARE[op](value, _bound(lo))
    lo_ok = value > _bound(lo2) if lo_end == "(" else value >= _bound(lo2)
    hi_ok = value < _bound(hi) if hi_end == ")" else value <= _bound(hi)
    return lo_ok and hi_ok


def _values(cfg: Config, key: str) -> list[tuple[str, Any]]:
    """(key, value) of a dotted key, ``key[i]`` per element of a tuple field."""
    value = dotted(cfg, key)
    if dataclasses.is_dataclass(value):  # a section's sub-settings (train.lora): their fields
        return [kv for f in dataclasses.fields(value) for kv in _values(cfg, f"{key}.{f.name}")]
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


def _validate_frame_cond(cfg: Config) -> None:
    """Video-to-world training (``diffusion.frame_cond`` > 0): leading latent frames the
    model's temporal patches cut whole, fewer than the clip's, unpacked batches."""
    c, m, d = cfg.diffusion, cfg.model, cfg.data
    if not c.frame_cond:
        return
    if m.discrete:
        raise ConfigError(
            f"diffusion.frame_cond: the {m.family_name} family conditions on frames by its "
            "causal order (vfm generate --prompt-video); set it for diffusion models only"
        )
    if c.frame_cond_max % m.patch[0] or c.frame_cond_max >= d.latent_frames:
        raise ConfigError(
            f"diffusion.frame_cond_max: {c.frame_cond_max} must be a multiple of model.patch[0]="
            f"{m.patch[0]} and below data.latent_frames={d.latent_frames}"
        )
    if d.max_tokens:
        raise ConfigError(
            "diffusion.frame_cond: conditioning on frames trains on unpacked batches; set "
            "data.max_tokens=0"
        )


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
    if not m.rope and not m.abs_pos:
        raise ConfigError(
            "model.rope: false needs model.abs_pos > 0 (absolute positions): without either the "
            "model sees no token positions"
        )
    if m.head_dim % 2:
        raise ConfigError(f"model.heads: head_dim {m.head_dim} must be even for RoPE")
    if m.heads % m.n_kv_heads:
        raise ConfigError(f"model.kv_heads: {m.kv_heads} does not divide model.heads={m.heads}")
    if m.freq_dim % 2:
        raise ConfigError(
            f"model.freq_dim: must be even (a cosine and a sine per frequency), got {m.freq_dim}"
        )
    if m.discrete:  # token ids of a vocabulary, one per latent cell
        if m.vocab_size < 2:
            raise ConfigError(
                f"model.vocab_size: must be >= 2 for arch {m.arch!r}, got {m.vocab_size}"
            )
        if tuple(m.patch) != (1, 1, 1):
            raise ConfigError(
                f"model.patch: arch {m.arch!r} predicts one token per latent cell, needs "
                f"(1, 1, 1), got {tuple(m.patch)}"
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
    _validate_frame_cond(cfg)
    _validate_blend(d)
    _validate_packing(cfg)
    _validate_sequence_split(cfg)
    if t.fp8 == "on" and cfg.parallel.tp > 1:
        raise ConfigError(
            f"train.fp8: 'on' cannot combine with parallel.tp={cfg.parallel.tp} (DTensor tensor "
            "parallelism shards torch linears, not transformer-engine ones); use 'auto' or tp=1"
        )
    p = cfg.parallel
    selective = p.activation_checkpointing and (
        p.activation_checkpointing_mode == "selective" or p.activation_checkpointing_blocks > 0
    )
    if p.fsdp_unit == "sublayer" and selective:
        raise ConfigError(
            "parallel.fsdp_unit: 'sublayer' cannot combine with selective activation "
            "checkpointing (its recompute replays the FSDP hooks inside a block); use 'block' or "
            "'auto'"
        )
    return cfg
