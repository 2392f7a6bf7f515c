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
    if m.arch == "ar":
        if cfg.data.max_tokens and (dims.tp > 1 or dims.cp > 1):
            raise ConfigError(
                f"data.max_tokens={cfg.data.max_tokens}: packed training of the autoregressive "
                f"family runs data-parallel so far (tp={dims.tp}, cp={dims.cp} given)"
            )
        if dims.pp > 1 and dims.tp > 1:
            raise ConfigError(
                f"parallel.pp={dims.pp} with parallel.tp={dims.tp}: the autoregressive family "
                "(model.arch 'ar') pipelines with dp_shard / dp_replicate only so far"
            )
        tokens = cfg.data.latent_frames * cfg.data.latent_height * cfg.data.latent_width
        sp = dims.tp if cfg.parallel.sequence_parallel else 1
        if dims.cp > 1 and tokens % (2 * dims.cp * sp):
            raise ConfigError(
                f"parallel.cp={dims.cp}: balanced causal context parallelism cuts the {tokens} "
                f"tokens of a video into 2 x cp{' x tp' if sp > 1 else ''} = {2 * dims.cp * sp} "
                "equal chunks; choose latent sizes whose token count divides that"
            )
    if dims.tp > 1 and (m.heads % dims.tp or m.n_kv_heads % dims.tp):
        raise ConfigError(
            f"parallel.tp: {dims.tp} must divide model.heads={m.heads} and the key/value heads "
            f"{m.n_kv_heads}"
        )
    if dims.pp > 1:
        if m.depth < dims.pp:
            raise ConfigError(
                f"parallel.pp: {dims.pp} stages need at least {dims.pp} blocks, model.depth is "
                f"{m.depth}"
            )
        if dims.cp > 1:
            raise ConfigError(
                f"parallel.pp={dims.pp} with parallel.cp={dims.cp}: pipeline x context parallel "
                "is not available (PP combines with dp_shard, dp_replicate and tp)"
            )
        if (b // dims.dp) % dims.pp:
            raise ConfigError(
                f"data.batch_size={b}: each of the dp={dims.dp} data-parallel ranks gets "
                f"{b // dims.dp} samples, which cannot be split into parallel.pp={dims.pp} "
                f"microbatches (use a multiple of {dims.dp * dims.pp})"
            )
    return dims
