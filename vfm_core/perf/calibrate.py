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

from vfm_core.config import ConfigError, ModelConfig
from vfm_core.perf.hardware import DEFAULT_EFFICIENCY, Efficiency, GpuSpec, gpu_spec
from vfm_core.perf.layout_rules import LAYOUT_KEYS, parse_fixed
from vfm_core.perf.timing import (
    Layout,
    Workload,
    step_time,
    tokens_per_step_per_gpu,
    workload,
)

CALIBRATABLE = ("gemm", "attention", "hbm", "nvlink", "ib")


def load_runs(path: str | Path) -> list[dict[str, Any]]:
    """Measured step records from a JSON list / ``{"runs": [...]}`` / JSONL file (e.g. rows of a
    run's ``metrics.jsonl`` that also carry the run's ``recipe``, ``seq`` and layout keys)."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as e:
        raise ConfigError(f"--calibrate: cannot read {path}: {e.strerror}") from None
    try:
        data = json.loads(text)
        records = data["runs"] if isinstance(data, dict) and "runs" in data else data
    except json.JSONDecodeError:
        try:
            records = [json.loads(line) for line in text.splitlines() if line.strip()]
        except json.JSONDecodeError as e:
            raise ConfigError(f"--calibrate: {path} is neither JSON nor JSONL: {e}") from None
    if isinstance(records, dict):
        records = [records]
    if not isinstance(records, list) or not all(isinstance(r, dict) for r in records):
        raise ConfigError(f"--calibrate: {path} must hold a list of run records (objects)")
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
    rec: Mapping[str, Any], default_hw: str
) -> tuple[Workload, Layout, GpuSpec, float]:
    from vfm_core.recipes import get_recipe

    if "model" in rec and isinstance(rec["model"], Mapping):
        try:
            cfg = ModelConfig(**rec["model"])
        except TypeError as e:
            raise ConfigError(f"--calibrate: bad model in a run record: {e}") from None
    elif "recipe" in rec:
        cfg = get_recipe(str(rec["recipe"])).model
    else:
        raise ConfigError("--calibrate: a run record needs 'recipe' or 'model'")
    seq = rec.get("seq", rec.get("seq_len"))
    if not isinstance(seq, int) or seq <= 0:
        raise ConfigError(f"--calibrate: a run record needs a positive 'seq', got {seq!r}")
    src = rec.get("layout", rec)
    kw = parse_fixed({k: src[k] for k in LAYOUT_KEYS if k in src})
    lay = Layout(**kw)
    try:
        gpu = gpu_spec(str(rec.get("hardware", default_hw)))
    except ValueError as e:
        raise ConfigError(f"--calibrate: {e}") from None
    if "tokens_per_s_per_gpu" in rec:
        measured = float(rec["tokens_per_s_per_gpu"])
    elif "tokens_per_s" in rec:
        measured = float(rec["tokens_per_s"]) / int(rec.get("gpus", lay.world))
    else:
        raise ConfigError(
            "--calibrate: a run record needs 'tokens_per_s' or 'tokens_per_s_per_gpu'"
        )
    if measured <= 0:
        raise ConfigError(f"--calibrate: measured throughput must be positive, got {measured}")
    grid = tuple(rec["grid"]) if "grid" in rec else None
    work = workload(cfg, seq_len=seq, grid=grid, text_len=rec.get("text_len"))  # type: ignore[arg-type]
    return work, lay, gpu, measured


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
    ``tokens_per_s_per_gpu`` or ``tokens_per_s`` (all GPUs; with ``gpus``)."""
    records = load_runs(runs) if isinstance(runs, str | Path) else list(runs)
    if not records:
        raise ConfigError("--calibrate: no runs to fit")
    for name in fit:
        if name not in CALIBRATABLE:
            raise ConfigError(f"cannot fit {name!r} (choose from {', '.join(CALIBRATABLE)})")
    cases = [_record_case(r, hardware) for r in records]

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
    n = len(cases)
    return Calibration(
        efficiency=eff,
        fitted={k: getattr(eff, k) for k in fit},
        rms_log_error_before=math.sqrt(before / n),
        rms_log_error_after=math.sqrt(loss(eff) / n),
        runs=n,
    )
