"""Which 4D-parallel layouts can run, and the trainer config of a layout (the planner's rules).

:func:`check_layout` mirrors the trainer's ``vfm_core.parallel.layout.validate_layout`` (tested
both ways in tests/perf/test_planner_trainer.py) and :func:`trainer_config` writes the run config
of a layout; :func:`global_batch` is a layout's samples per optimiser step and
:func:`parse_fixed` reads the pinned keys of ``vfm plan --fixed``; :func:`batch_splits` cuts one
global batch into a layout's micro-batches. The search itself lives in
:mod:`vfm_core.perf.planner`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from vfm_core.config import Config, ConfigError, ModelConfig
from vfm_core.config_validate import sequence_split
from vfm_core.families import family_of
from vfm_core.perf.hardware import GpuSpec
from vfm_core.perf.memory import RECOMPUTE_MODES
from vfm_core.perf.timing import Layout

LAYOUT_KEYS = tuple(f.name for f in dataclasses.fields(Layout))


def check_layout(cfg: ModelConfig, lay: Layout, *, seq_len: int, gpu: GpuSpec) -> str | None:
    """Why ``lay`` cannot run ``cfg`` at ``seq_len`` (None: it can). World size is not checked."""
    for key in ("dp_replicate", "dp_shard", "tp", "cp", "pp", "micro_batch", "microbatches", "vpp"):
        if getattr(lay, key) < 1:
            return f"{key}={getattr(lay, key)} must be >= 1"
    if lay.tp > cfg.heads:
        return f"tp={lay.tp} exceeds heads={cfg.heads}"
    if lay.tp > gpu.gpus_per_node:
        return f"tp={lay.tp} > {gpu.gpus_per_node} GPUs per node (TP/SP stay inside a node)"
    if cfg.heads % lay.tp:
        return f"tp={lay.tp} does not divide heads={cfg.heads}"
    if cfg.n_kv_heads % lay.tp:
        return f"tp={lay.tp} does not divide kv_heads={cfg.n_kv_heads}"
    if lay.sp and lay.tp == 1:
        return "sp=true needs tp > 1"
    if cfg.depth % lay.pp:  # stricter than the trainer (uneven stages): the model prices equal ones
        return f"pp={lay.pp} does not divide depth={cfg.depth}"
    why = _pipeline_reason(cfg, lay)
    if why:
        return why
    why = family_of(cfg).layout_reason(cfg, cp=lay.cp, cp_mode=lay.cp_mode)
    if why:
        return why
    parts, how = sequence_split(cfg, cp=lay.cp, tp=lay.tp if lay.sp else 1, prefix="")
    if seq_len % parts:
        return f"the sequence of {seq_len} tokens cannot be split into {parts} equal chunks ({how})"
    if lay.cp > 1 and (lay.cp_mode == "a2a" or cfg.arch == "stdit"):  # ST-DiT: hybrid a2a
        hq, hkv = cfg.heads // lay.tp, cfg.n_kv_heads // lay.tp
        if hq % lay.cp or hkv % lay.cp:
            return (
                f"all-to-all cp={lay.cp} needs heads per TP rank ({hq} q, {hkv} kv) divisible by cp"
            )
    if lay.recompute not in RECOMPUTE_MODES:
        return f"recompute={lay.recompute!r} (choose from {', '.join(RECOMPUTE_MODES)})"
    if lay.recompute_blocks:
        part = lay.stage_blocks(cfg.depth)
        if lay.recompute != "full":
            return f"recompute_blocks={lay.recompute_blocks} needs recompute=full"
        if not 0 < lay.recompute_blocks <= part:
            return f"recompute_blocks={lay.recompute_blocks}: each stage has {part} blocks"
    if lay.cp_mode not in ("ring", "a2a"):
        return f"cp_mode={lay.cp_mode!r} (choose ring or a2a)"
    return None


def _pipeline_reason(cfg: ModelConfig, lay: Layout) -> str | None:
    """The schedule rules of ``vfm_core.parallel.layout.pipeline_microbatches`` for a layout:
    ``microbatches`` is ``parallel.pp_microbatches`` with pp > 1 (``train.grad_accum`` with
    pp == 1, any count), ``vpp`` is ``parallel.pp_virtual_stages`` (interleaved 1F1B)."""
    pp, v, m = lay.pp, lay.vpp, lay.microbatches
    if pp == 1:
        if v > 1:  # the trainer ignores virtual stages without a pipeline; say so instead
            return f"vpp={v} (parallel.pp_virtual_stages) needs pp > 1"
        return None
    if cfg.depth % (pp * v):
        return (
            f"vpp={v} (parallel.pp_virtual_stages): the {cfg.depth} blocks (depth) cannot be cut "
            f"into pp x vpp = {pp * v} equal stages"
        )
    if m < pp:
        return (
            f"microbatches={m} (parallel.pp_microbatches) is below pp={pp}: 1F1B needs at least "
            "one microbatch per stage"
        )
    rounds = max(1, m // pp)
    if v > 1 and m % rounds:
        return (
            f"microbatches={m} (parallel.pp_microbatches): interleaved 1F1B runs them in "
            f"{rounds} rounds of about pp={pp}; use a multiple of {rounds}"
        )
    return None


def trainer_config(base: Config, lay: Layout) -> Config:
    """The run config that trains ``lay``: ``base`` with its parallel degrees, SP, CP mode,
    activation checkpointing and pipeline schedule set, and ``data.batch_size`` the layout's
    global batch (micro_batch · microbatches · dp_replicate · dp_shard). With pp > 1 the
    layout's micro-batches are ``parallel.pp_microbatches`` of a 1F1B schedule (interleaved 1F1B
    over ``pp_virtual_stages = vpp`` when vpp > 1) and ``train.grad_accum`` is 1; with pp == 1
    they are ``train.grad_accum``. ST-DiT ``ring`` is the trainer's ``hybrid`` (ring for full
    attention, all-to-all for spatial / temporal). ``validate_layout(trainer_config(...),
    lay.world)`` accepts every layout :func:`plan` returns (tests/perf/test_planner_trainer.py)."""
    stdit = base.model.arch == "stdit"
    mode = "alltoall" if lay.cp_mode == "a2a" else ("hybrid" if stdit else "ring")
    parallel = dataclasses.replace(
        base.parallel,
        dp_replicate=lay.dp_replicate,
        dp_shard=lay.dp_shard,
        tp=lay.tp,
        cp=lay.cp,
        pp=lay.pp,
        sequence_parallel=lay.sp,
        cp_mode=mode,
        activation_checkpointing=lay.recompute != "none",
        activation_checkpointing_mode="full" if lay.recompute == "none" else lay.recompute,
        activation_checkpointing_blocks=lay.recompute_blocks,
        pp_schedule="interleaved_1f1b" if lay.vpp > 1 else "1f1b",
        pp_virtual_stages=lay.vpp,
        pp_microbatches=lay.microbatches if lay.pp > 1 else 0,
    )
    data = dataclasses.replace(base.data, batch_size=global_batch(lay))
    train = dataclasses.replace(base.train, grad_accum=1 if lay.pp > 1 else lay.microbatches)
    return dataclasses.replace(base, parallel=parallel, data=data, train=train)


def global_batch(lay: Layout) -> int:
    """Samples per optimiser step over all data-parallel ranks (``data.batch_size``): one value
    for every layout the planner compares."""
    return lay.micro_batch * lay.microbatches * lay.dp_replicate * lay.dp_shard


BATCH_REASON = "samples per step"
"""Words of every :func:`batch_splits` refusal (the planner tells them from other reasons)."""


def batch_splits(
    batch: int,
    *,
    dp: int,
    pp: int,
    pins: Mapping[str, Any],
    sizes: tuple[int, ...],
) -> list[tuple[int, int]] | str:
    """(micro_batch, microbatches) pairs that make ``batch`` samples per step with ``dp``
    data-parallel replicas, smallest micro-batch first — from ``sizes``, or the pinned
    ``micro_batch`` / ``microbatches`` of ``pins`` — or why none does: each replica's share
    batch / dp is micro_batch x microbatches (:func:`global_batch`), and a pipeline needs at
    least ``pp`` micro-batches (1F1B: one per stage)."""
    if batch % dp:
        return f"{batch} {BATCH_REASON} do not split over dp={dp} data-parallel replicas"
    share = batch // dp
    if "microbatches" in pins:
        m = pins["microbatches"]
        mbs = [share // m] if share % m == 0 else []
        mbs = [x for x in mbs if pins.get("micro_batch", x) == x]
    else:
        mbs = [pins["micro_batch"]] if "micro_batch" in pins else list(sizes)
        mbs = [x for x in mbs if share % x == 0]
    pairs = [(mb, share // mb) for mb in mbs if pp == 1 or share // mb >= pp]
    if pairs:
        return pairs
    pinned = ",".join(f"{k}={pins[k]}" for k in ("micro_batch", "microbatches") if k in pins)
    why = f"not {pinned}" if pinned else f"fewer than pp={pp} micro-batches"
    return f"{batch} {BATCH_REASON} over dp={dp} leave {share} per replica: {why}"


def parse_fixed(text: str | Mapping[str, Any] | None) -> dict[str, Any]:
    """``"tp=1,cp=1,sp=false"`` (or a mapping) -> typed values; unknown keys and bad values raise
    :class:`ConfigError`."""
    if not text:
        return {}
    items = (
        text.items()
        if isinstance(text, Mapping)
        else (part.split("=", 1) if "=" in part else (part, None) for part in text.split(","))
    )
    out: dict[str, Any] = {}
    types = {f.name: f.type for f in dataclasses.fields(Layout)}
    for key, value in items:
        key = key.strip()
        if key not in types:
            raise ConfigError(f"--fixed: unknown key {key!r} (known: {', '.join(LAYOUT_KEYS)})")
        if value is None or (isinstance(value, str) and not value.strip()):
            raise ConfigError(f"--fixed: {key} needs a value ({key}=...)")
        raw = value.strip() if isinstance(value, str) else value
        if key == "sp":
            if isinstance(raw, bool):
                out[key] = raw
            elif str(raw).lower() in ("1", "true", "yes", "on"):
                out[key] = True
            elif str(raw).lower() in ("0", "false", "no", "off"):
                out[key] = False
            else:
                raise ConfigError(f"--fixed: sp expects true/false, got {raw!r}")
        elif key == "recompute":
            if raw not in RECOMPUTE_MODES:
                raise ConfigError(
                    f"--fixed: recompute expects one of {', '.join(RECOMPUTE_MODES)}, got {raw!r}"
                )
            out[key] = raw
        elif key == "cp_mode":
            if raw not in ("ring", "a2a"):
                raise ConfigError(f"--fixed: cp_mode expects ring or a2a, got {raw!r}")
            out[key] = raw
        else:
            try:
                out[key] = int(raw)
            except (TypeError, ValueError):
                raise ConfigError(f"--fixed: {key} expects an integer, got {raw!r}") from None
            low = 0 if key == "recompute_blocks" else 1  # 0 = every block
            if out[key] < low:
                raise ConfigError(f"--fixed: {key} must be >= {low}, got {out[key]}")
    return out
