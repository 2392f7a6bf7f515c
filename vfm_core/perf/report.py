"""Scaling-study report from MLflow runs: tokens/s, TFLOPS, MFU, scaling efficiency, and the
planner's prediction next to each measurement (``vfm report --study NAME``, ``flows/scaling.py``).

A study is the set of MLflow runs tagged ``vfm.study=NAME`` (the scaling flow tags every run it
starts). Per run the report takes the median of each throughput metric over the logged steps after
the first ``warmup`` (compilation, allocator and BLAS warm-up make the first steps slow).

Columns:

* ``tokens_per_s`` — the whole job (all ranks); ``per_proc`` = that / world size;
* ``tflops``, ``mfu`` — per process, as the trainer logs them (MFU against the run's peak:
  the datasheet for GPUs, a measured GEMM for CPU; vfm_core.perf.hardware);
* ``scaling_eff`` — per_proc / per_proc of the 1-process run of the same recipe (1.0 = linear);
* ``predicted`` — the planner's tokens/s for that layout (vfm_core.perf.timing.step_time) on the
  run's hardware: the GPU's datasheet figures, or for CPU runs a :func:`cpu_spec` built from the
  run's measured peak; the GEMM and attention efficiencies are first fitted to the study's
  1-process runs (vfm_core.perf.calibrate), so the column shows how well the planner's parallel
  model (communication, bubbles, sharding) extrapolates from one process to the layouts.
"""

from __future__ import annotations

import json
import math
import statistics
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from vfm_core.config import ConfigError, ModelConfig
from vfm_core.perf.hardware import PEAKS, GpuSpec, match_gpu
from vfm_core.perf.timing import Layout, step_time, tokens_per_step_per_gpu, workload
from vfm_core.tracking import LAYOUT_TAG, STAGE_TAG, STUDY_TAG

_DEGREES = ("dp_replicate", "dp_shard", "cp", "tp", "pp")


@dataclass(kw_only=True, slots=True)
class StudyRow:
    run_id: str
    layout: str
    recipe: str
    world: int
    degrees: dict[str, int]
    tokens_per_s: float
    per_proc: float
    tflops: float
    mfu: float
    scaling_eff: float | None = None
    predicted: float | None = None
    """Planner's tokens/s (whole job) for this layout, after calibration on 1-process runs."""
    hardware: str = "cpu"
    model: dict[str, Any] | None = None
    seq: int = 0
    peak_flops: float = 0.0
    batch: int = 1
    """Samples per step per data-parallel rank (the planner's micro-batch)."""


def cpu_spec(peak_flops: float, *, mem_tbps: float = 0.02, link_gbps: float = 4.0) -> GpuSpec:
    """A CPU described in the planner's terms: compute = the run's measured fp32 GEMM peak;
    ``mem_tbps`` ~ one socket's DDR bandwidth reached by element-wise torch ops (~20 GB/s on a
    small VM); ``link_gbps`` ~ gloo over loopback TCP between processes (a few GB/s). Both are
    rough, stated assumptions; the fitted efficiencies absorb the rest."""
    tflops = peak_flops / 1e12
    return GpuSpec(
        name="cpu",
        bf16_tflops=tflops,
        fp8_tflops=None,
        tf32_tflops=tflops,
        fp32_tflops=tflops,
        hbm_gb=16,
        hbm_tbps=mem_tbps,
        nvlink_gbps=link_gbps,
        ib_gbps=link_gbps * 8,
        gpus_per_node=64,
        source="measured fp32 GEMM peak of the run; bandwidths assumed",
    )


def _median_after(history: list[float], warmup: int) -> float:
    vals = history[warmup:] or history
    return statistics.median(vals) if vals else float("nan")


def study_runs(study: str, *, tracking_uri: str | None = None, warmup: int = 2) -> list[StudyRow]:
    """The finished runs tagged ``vfm.study=study``, as rows (no derived columns yet). A run
    whose params cannot be read is left out with one warning line naming the run and the param."""
    client = _read_only_client(tracking_uri)
    exps = [e.experiment_id for e in client.search_experiments()]
    runs = client.search_runs(exps, filter_string=_study_filter(study))
    rows, left_out = [], 0
    for run in runs:
        try:
            row = _row(client, run, warmup)
        except _BadParam as e:
            print(f"warning: {_who(run, study)}: {e}: left out of the report", file=sys.stderr)
            left_out += 1
            continue
        if row is not None:
            rows.append(row)
        elif run.data.tags.get(STAGE_TAG) != "scaling-study":  # the study's own (parent) run
            print(
                f"warning: {_who(run, study)}: logged no tokens_per_s (no step trained): left "
                "out of the report",
                file=sys.stderr,
            )
            left_out += 1
    if not rows:
        more = f" ({left_out} left out: see the warnings)" if left_out else ""
        raise ConfigError(f"no finished MLflow runs tagged {STUDY_TAG}={study!r}{more}")
    return sorted(rows, key=lambda r: (r.recipe, r.world, r.layout))


def _who(run, study: str) -> str:
    return f"MLflow run {run.info.run_id} (study {study!r})"


def _read_only_client(tracking_uri: str | None):
    """A client on the existing store at ``tracking_uri`` (else the environment's); a store that
    does not exist is refused, never created."""
    import mlflow

    from vfm_core.tracking import (
        DEFAULT_SOURCE,
        TrackingStoreError,
        open_store,
        refuse_missing_store,
        sqlite_path,
        tracking_uri_from,
    )

    if tracking_uri is not None and not tracking_uri.strip():
        raise ConfigError(
            "--tracking-uri is empty: name the study's MLflow store, or leave the flag out for "
            "the project store"
        )
    uri, source = tracking_uri_from(tracking_uri, "--tracking-uri", create=False)
    db = sqlite_path(uri)
    if source == DEFAULT_SOURCE and db is not None and not db.is_file():
        raise TrackingStoreError(
            f"no MLflow runs to report: {source} ({db}) does not exist yet (no run has been "
            "tracked under this VFM_DATA_DIR); point --tracking-uri or MLFLOW_TRACKING_URI at "
            "the study's store"
        )
    refuse_missing_store(uri, source, "a report only reads runs")
    open_store(uri, source=source, existing=True)  # a report never creates a store
    return mlflow.MlflowClient(tracking_uri=uri)


def _study_filter(study: str) -> str:
    """The MLflow filter for the study's finished runs (the name quoted with the quote character
    it does not hold: MLflow's filter syntax has no escape)."""
    if not study.strip():
        raise ConfigError(f"study name {study!r} is empty: name the study (MLflow tag {STUDY_TAG})")
    if "'" in study and '"' in study:
        raise ConfigError(
            f"study name {study!r} holds both quote characters (' and \"): MLflow's filter "
            "syntax cannot match such a tag value; rename the study"
        )
    q = '"' if "'" in study else "'"
    return f"tags.`{STUDY_TAG}` = {q}{study}{q} and attributes.status = 'FINISHED'"


class _BadParam(ValueError):
    """A param of a study run that cannot be read (the run is left out of the report)."""


def _param(p: dict[str, str], key: str, default, convert, what: str, ok=lambda v: True):
    """Param ``key`` converted (``default`` when the run has none), or :class:`_BadParam`."""
    if key not in p:
        return default
    try:
        value = convert(p[key])
    except (ValueError, TypeError):
        raise _BadParam(f"param {key}={p[key]!r} is not {what}") from None
    if not ok(value):
        raise _BadParam(f"param {key}={p[key]!r} is not {what}")
    return value


def _degrees(p: dict[str, str], world: int) -> dict[str, int]:
    """The run's parallel degrees, ``dp_shard=-1`` worked out from the world size."""
    degrees = {
        k: _param(p, f"parallel.{k}", 1, int, "an integer >= 1", lambda v: v >= 1)
        for k in _DEGREES
        if k != "dp_shard"
    }
    degrees["dp_shard"] = _param(
        p, "parallel.dp_shard", 1, int, "an integer >= 1 or -1", lambda v: v >= 1 or v == -1
    )
    if degrees["dp_shard"] < 1:  # -1: inferred from the world size (ParallelDims)
        rest = math.prod(v for k, v in degrees.items() if k != "dp_shard")
        degrees["dp_shard"] = max(1, world // rest)
    return {k: degrees[k] for k in _DEGREES}


def _model_params(p: dict[str, str]) -> dict[str, Any]:
    """The run's ``model.*`` params (lists and objects read as JSON)."""
    model = {}
    for k, v in p.items():
        if not k.startswith("model."):
            continue
        try:
            model[k.removeprefix("model.")] = json.loads(v) if v[:1] in "[{" else v
        except json.JSONDecodeError as e:
            raise _BadParam(f"param {k}={v!r} is not JSON ({e.msg})") from None
    return model


def _peak_flops(p: dict[str, str]) -> float:
    key = "peak_flops_per_gpu" if "peak_flops_per_gpu" in p else "peak_flops"
    return _param(
        p, key, 0.0, lambda v: float(v or 0), "a FLOP/s number >= 0", lambda v: 0 <= v < math.inf
    )


def _row(client, run, warmup: int) -> StudyRow | None:
    """The run as a row (None: it logged no throughput); :class:`_BadParam` for a bad param."""
    p, m = run.data.params, run.data.metrics
    if "tokens_per_s" not in m:
        return None
    world = _param(p, "world_size", 1, int, "an integer >= 1", lambda v: v >= 1)
    degrees = _degrees(p, world)
    model = _model_params(p)
    _model_kwargs(model)  # each model param readable (the planner's prediction needs them)
    batch = _param(p, "data.batch_size", 1, int, "an integer >= 1", lambda v: v >= 1)
    hist = {
        k: [x.value for x in client.get_metric_history(run.info.run_id, k)]
        for k in ("tokens_per_s", "tflops", "mfu")
    }
    tps = _median_after(hist["tokens_per_s"], warmup)
    return StudyRow(
        run_id=run.info.run_id,
        layout=run.data.tags.get(LAYOUT_TAG, f"{world}p"),
        recipe=p.get("recipe", run.data.tags.get("recipe", "?")),
        world=world,
        degrees=degrees,
        tokens_per_s=tps,
        per_proc=tps / world,
        tflops=_median_after(hist["tflops"], warmup),
        mfu=_median_after(hist["mfu"], warmup),
        hardware=match_gpu(p.get("peak_source", "")) or "cpu",
        model=model,
        seq=_seq(p),
        peak_flops=_peak_flops(p),
        batch=max(1, batch // (degrees["dp_replicate"] * degrees["dp_shard"])),
    )


def _seq(params: dict[str, str]) -> int:
    """Tokens per sample from the latent size and the patch (0: the run does not say)."""
    keys = [f"data.latent_{k}" for k in ("frames", "height", "width")]
    if any(k not in params for k in [*keys, "model.patch"]):
        return 0
    t, h, w = (_param(params, k, 1, int, "an integer >= 1", lambda v: v >= 1) for k in keys)
    pt, ph, pw = _param(
        params,
        "model.patch",
        (1, 1, 1),
        json.loads,
        "a list of three integers >= 1",
        lambda v: (
            isinstance(v, list)
            and len(v) == 3
            and all(isinstance(x, int) and not isinstance(x, bool) and x >= 1 for x in v)
        ),
    )
    return (t // pt) * (h // ph) * (w // pw)


def _model_kwargs(model: dict[str, Any]) -> dict[str, Any]:
    """``model.*`` params as :class:`ModelConfig` keyword arguments (unknown keys left out);
    :class:`_BadParam` naming a param of the wrong type."""
    fields = set(ModelConfig.__dataclass_fields__)
    kw: dict[str, Any] = {}
    for k, v in model.items():
        if k not in fields:
            continue
        default = getattr(ModelConfig(), k)
        try:
            kw[k] = _model_value(default, v)
        except (ValueError, TypeError):
            what = _MODEL_TYPES.get(type(default), "readable")
            raise _BadParam(f"param model.{k}={v!r} is not {what}") from None
    return kw


_MODEL_TYPES = {bool: "true or false", int: "an integer", float: "a number", tuple: "a JSON list"}
"""What a ``model.*`` param must be, by the type of the field's default (for the warning)."""


def _model_value(default: Any, v: Any) -> Any:
    """A param value converted to the type of the field's default."""
    if isinstance(default, bool):
        if str(v).lower() not in ("true", "false"):
            raise ValueError(v)
        return str(v).lower() == "true"
    if isinstance(default, int):
        return int(v)
    if isinstance(default, float):
        return float(v)
    if isinstance(default, tuple):
        if not isinstance(v, list | tuple):  # a JSON list (a row built in code: a tuple)
            raise TypeError(v)
        return tuple(v)
    if v in ("None", ""):
        return None
    return int(v) if isinstance(v, str) and v.isdigit() else v


def _model_config(row: StudyRow) -> ModelConfig | None:
    if not row.model:
        return None
    try:
        return ModelConfig(**_model_kwargs(row.model))
    except (TypeError, ValueError):
        return None


def _predict(row: StudyRow, gpu: GpuSpec, eff) -> float | None:
    cfg = _model_config(row)
    if cfg is None or row.seq <= 0:
        return None
    work = workload(cfg, seq_len=row.seq)
    lay = Layout(**row.degrees, micro_batch=row.batch)
    if lay.world != row.world:
        return None
    st = step_time(work, lay, gpu, eff)
    return tokens_per_step_per_gpu(work, lay) / st.step_s * row.world


def _spec(row: StudyRow) -> GpuSpec:
    return PEAKS[row.hardware] if row.hardware in PEAKS else cpu_spec(row.peak_flops or 1e11)


def add_derived(rows: list[StudyRow]) -> list[StudyRow]:
    """Fill ``scaling_eff`` and ``predicted`` (planner calibrated on the 1-process runs)."""
    from vfm_core.perf.calibrate import calibrate

    base = {r.recipe: r for r in rows if r.world == 1}
    for r in rows:
        b = base.get(r.recipe)
        r.scaling_eff = r.per_proc / b.per_proc if b and b.per_proc > 0 else None
    for recipe, b in base.items():
        gpu = _spec(b)
        cfg = _model_config(b)
        if cfg is None or b.seq <= 0:
            continue
        record = {
            "model": {k: getattr(cfg, k) for k in ModelConfig.__dataclass_fields__},
            "seq": b.seq,
            "micro_batch": b.batch,
            "tokens_per_s_per_gpu": b.per_proc,
        }
        try:
            eff = _calibrated(record, gpu, calibrate)
        except (ConfigError, ValueError, ZeroDivisionError):
            continue
        for r in rows:
            if r.recipe == recipe:
                r.predicted = _predict(r, gpu, eff)  # one machine type per study
    return rows


def _calibrated(record: dict[str, Any], gpu: GpuSpec, calibrate):
    """Fit GEMM/attention efficiency of ``gpu`` to one measured record (calibrate() looks hardware
    up by name, so the spec is registered for the duration of the fit)."""
    key = f"_study_{gpu.name}"
    PEAKS[key] = replace(gpu, name=key)
    try:
        return calibrate([{**record, "hardware": key}], hardware=key).efficiency
    finally:
        PEAKS.pop(key, None)


def format_table(rows: list[StudyRow]) -> str:
    head = (
        "layout",
        "recipe",
        "procs",
        "tokens/s",
        "per proc",
        "TFLOPS/proc",
        "MFU",
        "MFU peak TFLOPS (measured GEMM)",
        "scaling eff",
        "predicted tok/s",
        "pred/meas",
    )
    lines = [" | ".join(head), " | ".join("---" for _ in head)]
    for r in rows:
        ratio = r.predicted / r.tokens_per_s if r.predicted and r.tokens_per_s else None
        cells = (
            r.layout,
            r.recipe,
            str(r.world),
            f"{r.tokens_per_s:,.0f}",
            f"{r.per_proc:,.0f}",
            f"{r.tflops:.4f}",
            f"{r.mfu:.1%}",
            f"{r.peak_flops / 1e12:.4f}" if r.peak_flops else "-",
            "-" if r.scaling_eff is None else f"{r.scaling_eff:.2f}",
            "-" if r.predicted is None else f"{r.predicted:,.0f}",
            "-" if ratio is None else f"{ratio:.2f}",
        )
        lines.append(" | ".join(cells))
    return "\n".join(lines)


def plot(rows: list[StudyRow], out_dir: str | Path) -> list[Path]:
    """Two PNGs: throughput per layout (measured vs predicted) and MFU / scaling efficiency."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    labels = [f"{r.layout}\n({r.world}p)" for r in rows]
    x = list(range(len(rows)))
    fig, ax = plt.subplots(figsize=(max(5, 1.2 * len(rows)), 3.5))
    ax.bar([i - 0.2 for i in x], [r.tokens_per_s for r in rows], 0.4, label="measured")
    ax.bar([i + 0.2 for i in x], [r.predicted or 0 for r in rows], 0.4, label="planner")
    ax.set_xticks(x, labels)
    ax.set_ylabel("tokens/s (job)")
    ax.legend()
    ax.set_title("throughput by layout")
    fig.tight_layout()
    p1 = out / "throughput.png"
    fig.savefig(p1, dpi=100)
    plt.close(fig)
    fig, ax = plt.subplots(figsize=(max(5, 1.2 * len(rows)), 3.5))
    ax.bar([i - 0.2 for i in x], [r.mfu for r in rows], 0.4, label="MFU per process")
    eff = [r.scaling_eff if r.scaling_eff is not None else math.nan for r in rows]
    ax.bar([i + 0.2 for i in x], eff, 0.4, label="scaling efficiency")
    ax.set_xticks(x, labels)
    ax.legend()
    ax.set_title("MFU and scaling efficiency")
    fig.tight_layout()
    p2 = out / "efficiency.png"
    fig.savefig(p2, dpi=100)
    plt.close(fig)
    return [p1, p2]


def check_out_dir(out: str | Path, setting: str = "out_dir") -> Path:
    """The report's folder named by ``setting``, checked before any work
    (:func:`vfm_core.storage.local_folder`); it is created when the report is written."""
    from vfm_core.storage import local_folder

    return local_folder(out, setting, "the report")


def build_report(study: str, out_dir: str | Path, *, tracking_uri: str | None = None) -> dict:
    """Rows + derived columns -> ``report.md``, ``rows.json`` and the PNGs under ``out_dir``."""
    out = check_out_dir(out_dir)
    rows = add_derived(study_runs(study, tracking_uri=tracking_uri))
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ConfigError(f"out_dir {out}: the folder cannot be made ({e.strerror or e})") from None
    table = format_table(rows)
    (out / "report.md").write_text(f"# Scaling study `{study}`\n\n{table}\n")
    (out / "rows.json").write_text(json.dumps([row_dict(r) for r in rows], indent=1))
    pngs = plot(rows, out)
    return {
        "study": study,
        "table": table,
        "rows": len(rows),
        "dir": str(out),
        "files": [str(out / "report.md"), str(out / "rows.json"), *map(str, pngs)],
    }


def row_dict(r: StudyRow) -> dict[str, Any]:
    return {k: getattr(r, k) for k in StudyRow.__dataclass_fields__ if k != "model"}
