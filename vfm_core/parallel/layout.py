"""Is a run config trainable under a parallel layout? One answer, asked before any process starts
(``vfm train --nproc``, the Prefect training form) and again by the trainer on every rank.

``data.batch_size`` is the **global** batch (samples, or packs, per optimizer step over all
data-parallel ranks), so a layout never changes what a run trains on: each of the
``dp = dp_replicate * dp_shard`` ranks takes ``batch_size / dp``, and a pipeline splits that
into ``pp`` microbatches.
"""

from __future__ import annotations

import dataclasses

from vfm_core.config import DEGREES, Config, ConfigError, validate
from vfm_core.parallel.dims import ParallelDims


def with_degrees(cfg: Config, **degrees: int | None) -> Config:
    """``cfg`` with the given parallel degrees (None = keep the config's)."""
    given = {k: v for k, v in degrees.items() if v is not None}
    unknown = set(given) - set(DEGREES)
    if unknown:
        raise ConfigError(f"parallel degree {sorted(unknown)[0]!r} unknown")
    return dataclasses.replace(cfg, parallel=dataclasses.replace(cfg.parallel, **given))


def validate_layout(cfg: Config, world_size: int) -> ParallelDims:
    """The validated degrees of ``cfg.parallel`` over ``world_size`` ranks; a ConfigError naming
    the key when the layout does not divide the world, the model or the batch."""
    dims = ParallelDims.from_config(cfg.parallel, world_size)
    validate(cfg)  # includes the layout-dependent checks (e.g. data.max_tokens vs cp * tp)
    m, b = cfg.model, cfg.data.batch_size
    if b % dims.dp:
        raise ConfigError(
            f"data.batch_size={b} (the global batch) cannot be split evenly over dp={dims.dp} "
            f"data-parallel ranks (dp_replicate={dims.dp_replicate} x dp_shard={dims.dp_shard}); "
            f"use a multiple of {dims.dp}"
        )
    t = cfg.train
    if (b // dims.dp) % t.grad_accum:
        raise ConfigError(
            f"train.grad_accum={t.grad_accum}: each of the dp={dims.dp} data-parallel ranks gets "
            f"{b // dims.dp} of data.batch_size={b}, which cannot be split into {t.grad_accum} "
            f"accumulation steps (use a batch size that is a multiple of {dims.dp * t.grad_accum})"
        )
    if dims.tp > 1 and (m.heads % dims.tp or m.n_kv_heads % dims.tp):
        raise ConfigError(
            f"parallel.tp: {dims.tp} must divide model.heads={m.heads} and the key/value heads "
            f"{m.n_kv_heads}"
        )
    pipeline_microbatches(cfg, dims)
    _check_recompute_blocks(cfg, dims)
    return dims


def _check_recompute_blocks(cfg: Config, dims: ParallelDims) -> None:
    p, key = cfg.parallel, "parallel.activation_checkpointing_blocks"
    n = p.activation_checkpointing_blocks
    if n < 0:
        raise ConfigError(f"{key}: must be >= 0 (0 = every block), got {n}")
    if n == 0:
        return
    if not p.activation_checkpointing or p.activation_checkpointing_mode != "full":
        raise ConfigError(
            f"{key}={n} needs parallel.activation_checkpointing=true with "
            "parallel.activation_checkpointing_mode=full (the other blocks run selective)"
        )
    part = cfg.model.depth // (dims.pp * p.pp_virtual_stages)  # the smallest model part
    if n > part:
        raise ConfigError(
            f"{key}={n} exceeds the {part} blocks of each model part (model.depth="
            f"{cfg.model.depth} over pp x virtual stages = {dims.pp * p.pp_virtual_stages})"
        )


def pipeline_microbatches(cfg: Config, dims: ParallelDims) -> int:
    """Microbatches of one pipeline schedule run (0 without PP), after checking the schedule,
    the virtual stages and the split of each rank's batch; a ConfigError names the key."""
    p, m = cfg.parallel, cfg.model
    if p.pp_virtual_stages < 1:
        raise ConfigError(f"parallel.pp_virtual_stages: must be >= 1, got {p.pp_virtual_stages}")
    if p.pp_microbatches < 0:
        raise ConfigError(
            f"parallel.pp_microbatches: must be >= 0 (0 = one per stage), got {p.pp_microbatches}"
        )
    if dims.pp == 1:
        if p.pp_virtual_stages > 1:
            raise ConfigError(
                f"parallel.pp_virtual_stages={p.pp_virtual_stages} needs pipeline parallelism "
                "(parallel.pp > 1)"
            )
        return 0
    v, stages = p.pp_virtual_stages, dims.pp * p.pp_virtual_stages
    if v > 1 and p.pp_schedule != "interleaved_1f1b":
        raise ConfigError(
            f"parallel.pp_virtual_stages={v} needs parallel.pp_schedule=interleaved_1f1b "
            f"(got {p.pp_schedule!r}, one stage per rank)"
        )
    if m.depth < stages:
        raise ConfigError(
            f"parallel.pp: {dims.pp} ranks x {v} virtual stages need at least {stages} blocks, "
            f"model.depth is {m.depth}"
        )
    if v > 1 and m.depth % stages:
        raise ConfigError(
            f"parallel.pp_virtual_stages={v}: the {m.depth} blocks (model.depth) cannot be cut "
            f"into pp x virtual stages = {stages} equal stages"
        )
    micro = p.pp_microbatches or dims.pp
    if p.pp_schedule != "gpipe" and micro < dims.pp:
        raise ConfigError(
            f"parallel.pp_microbatches={micro} is below the {dims.pp} pipeline stages: the "
            f"{p.pp_schedule} schedule needs at least one microbatch per stage"
        )
    rounds = max(1, micro // dims.pp)
    if p.pp_schedule == "interleaved_1f1b" and micro % rounds:
        raise ConfigError(
            f"parallel.pp_microbatches={micro}: interleaved 1F1B runs them in rounds of about "
            f"pp={dims.pp}; use a multiple of {rounds} (e.g. {rounds * dims.pp})"
        )
    per_pass = cfg.data.batch_size // dims.dp // cfg.train.grad_accum
    if per_pass % micro:
        raise ConfigError(
            f"data.batch_size={cfg.data.batch_size}: each data-parallel rank's pass holds "
            f"{per_pass} {'packs' if cfg.data.max_tokens else 'samples'} (batch / dp={dims.dp} / "
            f"train.grad_accum={cfg.train.grad_accum}), which cannot be split into "
            f"parallel.pp_microbatches={micro} microbatches (use a multiple of "
            f"{dims.dp * cfg.train.grad_accum * micro})"
        )
    return micro
