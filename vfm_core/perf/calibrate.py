"""Calibration of the planner's efficiency constants from measured runs (``vfm plan --calibrate``).

Each measured record (JSON, JSONL or ``{"runs": [...]}``; e.g. rows of a training run's
``metrics.jsonl`` with its layout and config) is turned into a workload + layout, and the named
efficiency constants of :class:`vfm_core.perf.hardware.Efficiency` are fitted to minimise the RMS
log error between predicted and measured step time.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vfm_core.config import ConfigError, ModelConfig, build_settings
from vfm_core.perf.hardware import DEFAULT_EFFICIENCY, Efficiency, GpuSpec, gpu_spec
from vfm_core.perf.layout_rules import LAYOUT_KEYS, check_layout, parse_fixed
from vfm_core.perf.planner import MAX_GPUS, MAX_SEQ_LEN
from vfm_core.perf.timing import (
    Layout,
    Workload,
    step_time,
    tokens_per_step_per_gpu,
    workload,
)
from vfm_core.storage import not_regular

CALIBRATABLE = ("gemm", "attention", "hbm", "nvlink", "ib")
MAX_TEXT_LEN = 2**20
"""The largest ``text_len`` of a record (the run config's ``model.text_len`` bound)."""


def load_runs(path: str | Path) -> list[dict[str, Any]]:
    """Measured step records from a JSON list / ``{"runs": [...]}`` / JSONL file (e.g. rows of a
    run's ``metrics.jsonl`` that also carry the run's ``recipe``, ``seq`` and layout keys)."""
    kind = not_regular(path)  # only stat: opening a FIFO would block forever
    if kind is not None:
        raise ConfigError(f"--calibrate {path}: cannot read it: {kind}")
    try:
        text = Path(path).read_bytes().decode("utf-8")
    except OSError as e:
        raise ConfigError(f"--calibrate {path}: cannot read it: {e.strerror or e}") from None
    except UnicodeDecodeError as e:
        raise ConfigError(
            f"--calibrate {path}: not UTF-8 text (byte {e.start}); expected JSON or JSONL"
        ) from None
    try:
        data = json.loads(text)
        records = data["runs"] if isinstance(data, dict) and "runs" in data else data
    except json.JSONDecodeError:
        try:
            records = [json.loads(line) for line in text.splitlines() if line.strip()]
        except json.JSONDecodeError as e:
            raise ConfigError(f"--calibrate {path}: neither JSON nor JSONL: {e}") from None
    if isinstance(records, dict):
        records = [records]
    if not isinstance(records, list) or not all(isinstance(r, dict) for r in records):
        raise ConfigError(f"--calibrate {path}: must hold a list of run records (objects)")
    return records


@dataclass(kw_only=True, slots=True)
class Calibration:
    """Fitted constants and the fit quality (RMS of log(pred / measured))."""

    efficiency: Efficiency
    fitted: dict[str, float]
    rms_log_error_before: float
    rms_log_error_after: float
    runs: int


def _record_case(
    rec: Mapping[str, Any], default_hw: str, where: str
) -> tuple[Workload, Layout, GpuSpec, float]:
    """The workload, layout, GPU and measured tokens/s/GPU of one record; every bad field raises
    one :class:`ConfigError` starting with ``where`` (the file and the record) and the field."""
    cfg = _record_model(rec, where)
    seq = _record_seq(rec, where)
    lay = _record_layout(rec, where)
    hardware = rec.get("hardware", default_hw)
    try:
        gpu = gpu_spec(_string(hardware, "hardware", where))
    except ValueError as e:
        raise ConfigError(f"{where}: hardware: {e}") from None
    why = check_layout(cfg, lay, seq_len=seq, gpu=gpu)
    if why:
        raise ConfigError(f"{where}: layout: {why}")
    measured = _record_throughput(rec, lay, where)
    grid = _record_grid(rec, seq, where)
    text_len = _integer(rec, "text_len", where, low=0, high=MAX_TEXT_LEN)
    work = workload(cfg, seq_len=seq, grid=grid, text_len=text_len)
    return work, lay, gpu, measured


def _record_model(rec: Mapping[str, Any], where: str) -> ModelConfig:
    """``recipe`` (a preset name) and / or ``model`` (fields on top of the recipe's model, or of
    the default model), checked as the run config checks them."""
    from vfm_core.config import Config, merge, validate
    from vfm_core.recipes import get_recipe

    if "recipe" not in rec and "model" not in rec:
        raise ConfigError(f"{where}: needs 'recipe' (a preset name) or 'model' (its fields)")
    model = rec.get("model", {})
    if not isinstance(model, Mapping):
        raise ConfigError(f"{where}: model: expected a mapping of fields, got {model!r}")
    recipe = _string(rec["recipe"], "recipe", where) if "recipe" in rec else None
    try:
        cfg = merge(Config() if recipe is None else get_recipe(recipe), {"model": dict(model)})
        # the model alone is checked: data sizes of one patch always divide by the patch
        t, h, w = cfg.model.patch
        data = dataclasses.replace(cfg.data, latent_frames=t, latent_height=h, latent_width=w)
        validate(dataclasses.replace(cfg, data=data))
    except ConfigError as e:
        raise ConfigError(f"{where}: {e}") from None
    return cfg.model


def _record_seq(rec: Mapping[str, Any], where: str) -> int:
    """``seq`` (or ``seq_len``): video tokens per sample, 1 .. MAX_SEQ_LEN."""
    if "seq" in rec and "seq_len" in rec and rec["seq"] != rec["seq_len"]:
        raise ConfigError(f"{where}: seq {rec['seq']!r} and seq_len {rec['seq_len']!r} differ")
    key = "seq" if "seq" in rec else "seq_len"
    seq = _integer(rec, key, where, low=1, high=MAX_SEQ_LEN)
    if seq is None:
        raise ConfigError(f"{where}: needs 'seq' (video tokens per sample)")
    return seq


def _record_layout(rec: Mapping[str, Any], where: str) -> Layout:
    """The layout keys under ``layout`` or at the top level (both: they must agree)."""
    keys = top = {k: rec[k] for k in LAYOUT_KEYS if k in rec}
    if "layout" in rec:
        if not isinstance(rec["layout"], Mapping):
            raise ConfigError(f"{where}: layout: expected a mapping of keys, got {rec['layout']!r}")
        keys = dict(rec["layout"])
        for k, v in top.items():
            if k in keys and keys[k] != v:
                raise ConfigError(f"{where}: {k}: {v!r} but layout.{k}: {keys[k]!r}; keep one")
    fields = {f.name for f in dataclasses.fields(Layout)}  # each of its type, as configs are
    typed = {k: v for k, v in keys.items() if k in fields}
    build_settings(Layout, typed, prefix=f"{where}: layout")
    try:
        return Layout(**parse_fixed(keys))
    except ConfigError as e:  # parse_fixed speaks of --fixed; this came from the record
        raise ConfigError(f"{where}: layout: {str(e).removeprefix('--fixed: ')}") from None


def _record_throughput(rec: Mapping[str, Any], lay: Layout, where: str) -> float:
    """``tokens_per_s_per_gpu``, else ``tokens_per_s`` / ``gpus`` (default: the layout's)."""
    if "tokens_per_s_per_gpu" in rec:
        return _positive(rec, "tokens_per_s_per_gpu", where)
    if "tokens_per_s" in rec:
        gpus = _integer(rec, "gpus", where, low=1, high=MAX_GPUS)
        return _positive(rec, "tokens_per_s", where) / (gpus or lay.world)
    raise ConfigError(f"{where}: needs 'tokens_per_s_per_gpu' or 'tokens_per_s' (with 'gpus')")


def _record_grid(rec: Mapping[str, Any], seq: int, where: str) -> tuple[int, int, int] | None:
    """``grid``: the (t, h, w) token grid, t·h·w = seq (None: the planner's default grid)."""
    if "grid" not in rec:
        return None
    g = rec["grid"]
    ok = isinstance(g, list | tuple) and len(g) == 3
    if not ok or not all(isinstance(x, int) and not isinstance(x, bool) and x > 0 for x in g):
        raise ConfigError(f"{where}: grid: expected [t, h, w], 3 positive integers, got {g!r}")
    if math.prod(g) != seq:
        raise ConfigError(f"{where}: grid: {list(g)} holds {math.prod(g)} tokens, seq is {seq}")
    return (g[0], g[1], g[2])


def _integer(rec: Mapping[str, Any], key: str, where: str, *, low: int, high: int) -> int | None:
    """``rec[key]`` as an integer in [low, high] (None when absent)."""
    if key not in rec:
        return None
    v = rec[key]
    if isinstance(v, bool) or not isinstance(v, int):
        raise ConfigError(f"{where}: {key}: expected an integer, got {v!r}")
    if not low <= v <= high:
        raise ConfigError(f"{where}: {key}: must be in [{low}, {high}], got {v}")
    return v


def _positive(rec: Mapping[str, Any], key: str, where: str) -> float:
    """``rec[key]`` as a finite number > 0 (JSON's NaN and Infinity refused)."""
    v = rec[key]
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or v <= 0:
        raise ConfigError(f"{where}: {key}: expected a finite number > 0, got {v!r}")
    return float(v)


def _string(value: Any, key: str, where: str) -> str:
    if not isinstance(value, str):
        raise ConfigError(f"{where}: {key}: expected a string, got {value!r}")
    return value


def calibrate(
    runs: Sequence[Mapping[str, Any]] | str | Path,
    *,
    fit: Sequence[str] = ("gemm", "attention"),
    base: Efficiency = DEFAULT_EFFICIENCY,
    hardware: str = "h100",
    rounds: int = 4,
) -> Calibration:
    """Fit the ``fit`` fields of :class:`Efficiency` so predicted tokens/s/GPU match measured runs.

    Minimises Σ log²(predicted / measured) by coordinate descent, each coordinate a golden-section
    search over (0.02, 1.5) × its default (fractions are capped at 1). Each record: ``recipe`` (or a
    ``model`` dict), ``seq``, layout keys (top-level or under ``layout``), ``hardware``, and
    ``tokens_per_s_per_gpu`` or ``tokens_per_s`` (all GPUs; with ``gpus``). A record that is
    not that raises one :class:`ConfigError` naming the file, the record and the field."""
    source = f"--calibrate {runs}" if isinstance(runs, str | Path) else "calibration runs"
    records = load_runs(runs) if isinstance(runs, str | Path) else list(runs)
    if not records:
        raise ConfigError(f"{source}: no runs to fit")
    for name in fit:
        if name not in CALIBRATABLE:
            raise ConfigError(f"cannot fit {name!r} (choose from {', '.join(CALIBRATABLE)})")
    n = len(records)
    cases = [
        _record_case(r, hardware, f"{source}: record {i + 1} of {n}") for i, r in enumerate(records)
    ]

    def loss(e: Efficiency) -> float:
        total = 0.0
        for work, lay, gpu, measured in cases:
            st = step_time(work, lay, gpu, e)
            pred = tokens_per_step_per_gpu(work, lay) / st.step_s
            total += math.log(pred / measured) ** 2
        return total

    before = loss(base)
    eff = base
    golden = (math.sqrt(5) - 1) / 2
    for _ in range(rounds):
        for name in fit:
            # from 0.1% of the table's value: a CPU shared with other work can run a 1-process
            # study row at a few % of its measured GEMM peak, and the fit must still reach it
            lo, hi = 0.001 * getattr(base, name), min(1.0, 1.5 * getattr(base, name))
            if name in ("nvlink", "ib", "hbm", "gemm", "attention"):
                hi = min(hi, 1.0)

            def f(x: float, name: str = name, cur: Efficiency = eff) -> float:
                return loss(dataclasses.replace(cur, **{name: x}))

            a, b = lo, hi
            c, d = b - golden * (b - a), a + golden * (b - a)
            fc, fd = f(c), f(d)
            for _ in range(40):
                if fc < fd:
                    b, d, fd = d, c, fc
                    c = b - golden * (b - a)
                    fc = f(c)
                else:
                    a, c, fc = c, d, fd
                    d = a + golden * (b - a)
                    fd = f(d)
            eff = dataclasses.replace(eff, **{name: (a + b) / 2})
    return Calibration(
        efficiency=eff,
        fitted={k: getattr(eff, k) for k in fit},
        rms_log_error_before=math.sqrt(before / n),
        rms_log_error_after=math.sqrt(loss(eff) / n),
        runs=n,
    )
