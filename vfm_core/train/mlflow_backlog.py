"""What a training run could not send to its MLflow server, and the one command that sends it.

A run whose tracking server stops answering goes on (:class:`vfm_core.train.metrics.MLflowLogger`
buffers and sends when the server is back). What is still unsent when the run ends is named in
``RUN_DIR/mlflow_backlog.json`` (:data:`BACKLOG_FILE`): the MLflow run id and tracking URI, the
status the run ended with, the tags and artifacts not yet set. ``metrics.jsonl`` always holds
every step, so the backlog names no metric values: :func:`backfill` (``vfm track backfill
RUN_DIR``) logs the steps of ``metrics.jsonl`` that the MLflow run lacks (per metric key, so it
can run twice), sets the tags, uploads the artifacts, ends the run with its status and removes the
backlog file."""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from vfm_core.errors import UserError

BACKLOG_FILE = "mlflow_backlog.json"
"""In a run directory: what the run could not send to its MLflow server."""
BATCH = 1000
"""Metrics per ``log_batch`` call (MLflow's limit)."""


class BackfillError(UserError, ValueError):
    """A run directory that cannot be backfilled: no MLflow run named, or its server is down."""


@dataclass(kw_only=True, slots=True)
class Backlog:
    """The unsent part of a training run's MLflow record (``RUN_DIR/mlflow_backlog.json``)."""

    run_id: str
    """The MLflow run."""
    tracking_uri: str
    """The store the run was logging to."""
    status: str = "RUNNING"
    """The status the run ended with (set when backfilled)."""
    tags: dict[str, str] = field(default_factory=dict)
    """Tags not yet set."""
    artifacts: list[str] = field(default_factory=list)
    """Local files not yet uploaded."""
    since: float = 0.0
    """Unix time of the first failed call."""
    reason: str = ""
    """The first failure, one line."""

    def write(self, path: str | Path) -> None:
        """Write atomically (a temporary file renamed over it)."""
        path = Path(path)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(asdict(self), indent=1))
        os.replace(tmp, path)

    @classmethod
    def read(cls, path: str | Path) -> Backlog:
        doc = json.loads(Path(path).read_text())
        return cls(**{k: v for k, v in doc.items() if k in cls.__dataclass_fields__})


def _jsonl_rows(path: Path) -> list[dict[str, Any]]:
    """Records of ``metrics.jsonl``; a torn last line (a kill mid-write) is left out."""
    rows = []
    lines = [ln for ln in path.read_text().splitlines() if ln.strip()]
    for n, ln in enumerate(lines):
        try:
            rows.append(json.loads(ln))
        except json.JSONDecodeError:
            if n < len(lines) - 1:
                raise BackfillError(f"{path}: line {n + 1} is not a metrics record") from None
    return rows


def backfill(run_dir: str | Path, *, tracking_uri: str | None = None) -> dict[str, Any]:
    """Send what the training run in ``run_dir`` could not send to its MLflow run (see the
    module docstring); returns ``{"run_id", "tracking_uri", "metrics", "tags", "artifacts",
    "status"}`` (counts sent, the status set). Without a backlog file the run named by
    ``summary.json`` gets the steps it lacks (nothing else changes). Safe to run again."""
    import mlflow
    from mlflow.entities import Metric

    from vfm_core.tracking import open_store, tracking_uri_from

    run_dir = Path(run_dir)
    backlog_path = run_dir / BACKLOG_FILE
    if backlog_path.exists():
        backlog = Backlog.read(backlog_path)
    elif (run_dir / "summary.json").exists():
        summary = json.loads((run_dir / "summary.json").read_text())
        if not summary.get("mlflow_run_id"):
            raise BackfillError(f"{run_dir}: the run logged to no MLflow run (summary.json)")
        backlog = Backlog(run_id=summary["mlflow_run_id"], tracking_uri="")
        backlog.status = ""  # the run ended itself: leave its status
    else:
        raise BackfillError(
            f"{run_dir}: no {BACKLOG_FILE} and no summary.json (not a training run directory, "
            "or one that never started)"
        )
    if backlog.tracking_uri and not tracking_uri:
        uri, source = backlog.tracking_uri, f"{backlog_path.name} tracking_uri"
    else:  # the flag, else the environment's store
        uri, source = tracking_uri_from(tracking_uri, "--tracking-uri")
    open_store(uri, source=source)  # one line if still down
    client = mlflow.MlflowClient(uri)
    rows = _jsonl_rows(run_dir / "metrics.jsonl") if (run_dir / "metrics.jsonl").exists() else []
    keys = sorted({k for r in rows for k in r if k != "step"})
    have = {k: {m.step for m in client.get_metric_history(backlog.run_id, k)} for k in keys}
    ts = int(os.path.getmtime(run_dir / "metrics.jsonl") * 1000) if rows else 0
    missing = [
        Metric(k, float(v), ts, int(r["step"]))
        for r in rows
        for k, v in r.items()
        if k != "step" and isinstance(v, int | float) and r["step"] not in have[k]
    ]
    for i in range(0, len(missing), BATCH):
        client.log_batch(backlog.run_id, metrics=missing[i : i + BATCH])
    for k, v in backlog.tags.items():
        client.set_tag(backlog.run_id, k, v)
    sent_artifacts = [a for a in backlog.artifacts if Path(a).exists()]
    for a in sent_artifacts:
        client.log_artifact(backlog.run_id, a)
    if backlog.status and backlog.status != "RUNNING":
        client.set_terminated(backlog.run_id, status=backlog.status)
    backlog_path.unlink(missing_ok=True)
    return {
        "run_id": backlog.run_id,
        "tracking_uri": uri,
        "metrics": len(missing),
        "tags": len(backlog.tags),
        "artifacts": len(sent_artifacts),
        "status": backlog.status or None,
    }
