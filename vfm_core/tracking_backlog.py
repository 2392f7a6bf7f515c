"""What a training run could not send to its MLflow server, and the one command that sends it.

A run whose tracking server stops answering goes on (:class:`vfm_core.tracking_logger.MLflowLogger`
buffers and sends when the server is back). What is still unsent when the run ends is named in
``RUN_DIR/mlflow_backlog.json`` (:data:`BACKLOG_FILE`): the MLflow run id and tracking URI, the
status the run ended with, the tags and artifacts not yet set. ``metrics.jsonl`` always holds
every step, so the backlog names no metric values: :func:`backfill` (``vfm track backfill
RUN_DIR``) logs the steps of ``metrics.jsonl`` that the MLflow run lacks (per metric key, so it
can run twice), sets the tags, uploads the artifacts, ends the run with its status and removes the
backlog file.

The store is ``--tracking-uri``, else the backlog's, else the run's own (``config.yaml``
``tracking.tracking_uri``), else the one the run fell back to ($MLFLOW_TRACKING_URI, the default
store under the data dir). A backfill only adds to a run the store already holds: a store that
does not exist is refused (never created at a mistyped path), so is a run the store lacks. Every
file of the run directory it reads is checked, and a bad one is one :class:`BackfillError` line
naming the file (and line) and the problem. An artifact that no longer exists cannot be sent: one
warning line each, and the backlog file is kept naming only those (restore them and run again, or
delete the file to give them up)."""

from __future__ import annotations

import json
import os
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from vfm_core.errors import UserError

BACKLOG_FILE = "mlflow_backlog.json"
"""In a run directory: what the run could not send to its MLflow server."""
BATCH = 1000
"""Metrics per ``log_batch`` call (MLflow's limit)."""
RUN_STATUSES = ("RUNNING", "SCHEDULED", "FINISHED", "FAILED", "KILLED")
"""MLflow's run statuses (``mlflow.entities.RunStatus``)."""


class BackfillError(UserError, ValueError):
    """A run directory that cannot be backfilled: a damaged file, no MLflow run named, a store
    that does not exist or lacks the run, or its server is down."""


def _is_number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def _string_map(v: Any) -> bool:
    return isinstance(v, dict) and all(isinstance(x, str) for kv in v.items() for x in kv)


_FIELDS: dict[str, tuple[Any, str]] = {
    "run_id": (lambda v: isinstance(v, str) and bool(v.strip()), "a non-empty run id string"),
    "tracking_uri": (lambda v: isinstance(v, str), "a string"),
    "status": (lambda v: v in RUN_STATUSES, "one of " + ", ".join(RUN_STATUSES)),
    "tags": (_string_map, 'an object of string tags, {"key": "value"}'),
    "artifacts": (
        lambda v: isinstance(v, list) and all(isinstance(a, str) and a for a in v),
        "a list of file paths",
    ),
    "since": (_is_number, "a number (Unix time)"),
    "reason": (lambda v: isinstance(v, str), "a string"),
}
"""Each backlog field: its check and what it must be (for the error line)."""


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
        """The backlog in ``path``; a :class:`BackfillError` naming the file and the field when
        it is not one (unknown fields are left for a newer writer)."""
        doc = _json_object(Path(path))
        if "run_id" not in doc:
            raise BackfillError(f"{path}: no run_id (the MLflow run to send to)")
        for name, (ok, what) in _FIELDS.items():
            if name in doc and not ok(doc[name]):
                raise BackfillError(f"{path}: {name} is {doc[name]!r}; expected {what}")
        return cls(**{k: v for k, v in doc.items() if k in _FIELDS})


def _first_line(e: object) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def _json_object(path: Path) -> dict[str, Any]:
    """The JSON object in ``path``, or a :class:`BackfillError` naming the file and why not."""
    try:
        doc = json.loads(path.read_bytes().decode())
    except OSError as e:
        raise BackfillError(f"{path}: cannot be read ({e.strerror or e})") from None
    except UnicodeDecodeError as e:
        raise BackfillError(f"{path}: not UTF-8 text (byte {e.start}): not a JSON file") from None
    except json.JSONDecodeError as e:
        raise BackfillError(f"{path}: not JSON ({e.msg}, line {e.lineno})") from None
    if not isinstance(doc, dict):
        raise BackfillError(f"{path}: a JSON {type(doc).__name__}, not an object {{...}}")
    return doc


class _BadLine(ValueError):
    """A ``metrics.jsonl`` line that is not a record; ``torn``: not even JSON."""

    def __init__(self, why: str, *, torn: bool = False):
        super().__init__(why)
        self.torn = torn


def _metrics_record(raw: bytes) -> dict[str, Any]:
    """One line of ``metrics.jsonl``: ``{"step": N, "key": number, ...}``."""
    try:
        rec = json.loads(raw.decode())
    except UnicodeDecodeError as e:
        raise _BadLine(f"is not UTF-8 text (byte {e.start})") from None
    except json.JSONDecodeError as e:
        raise _BadLine(f"is not JSON ({e.msg})", torn=True) from None
    if not isinstance(rec, dict):
        raise _BadLine(f'is a JSON {type(rec).__name__}, not a record {{"step": N, ...}}')
    step = rec.get("step")
    if isinstance(step, bool) or not isinstance(step, int):
        raise _BadLine(f"has step {step!r}; expected an integer step")
    for k, v in rec.items():
        if k != "step" and not _is_number(v):
            raise _BadLine(f"has {k} = {v!r}; expected a number")
    return rec


def _jsonl_rows(path: Path) -> list[dict[str, Any]]:
    """Records of ``metrics.jsonl``; a torn last line (a kill mid-write) is left out with a
    warning line, any other bad line is a :class:`BackfillError` naming it."""
    try:
        data = path.read_bytes()
    except OSError as e:
        raise BackfillError(f"{path}: cannot be read ({e.strerror or e})") from None
    lines = [(i, ln) for i, ln in enumerate(data.splitlines(), 1) if ln.strip()]
    rows = []
    for n, (i, raw) in enumerate(lines):
        try:
            rows.append(_metrics_record(raw))
        except _BadLine as e:
            if not (e.torn and n == len(lines) - 1):
                raise BackfillError(f"{path}: line {i} {e}: not a metrics record") from None
            print(f"warning: {path}: line {i} (the last) is torn: left out", file=sys.stderr)
    return rows


def _configured_uri(path: Path) -> str:
    """``tracking.tracking_uri`` of the run's ``config.yaml`` ('' when it names none)."""
    import yaml

    if not path.exists():
        return ""
    try:
        doc = yaml.safe_load(path.read_text())
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as e:
        raise BackfillError(f"{path}: cannot be read as YAML ({_first_line(e)})") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("tracking", {}), dict):
        raise BackfillError(f"{path}: not a run config (a mapping with a tracking: section)")
    uri = doc.get("tracking", {}).get("tracking_uri") or ""
    if not isinstance(uri, str):
        raise BackfillError(f"{path}: tracking.tracking_uri is not a string (not a run config)")
    return uri.strip()


def _run_store(run_dir: Path, flag: str | None, backlog: Backlog) -> tuple[str, str]:
    """(tracking URI, where it was set): the flag, the backlog's, the run's config, then the
    store the run fell back to (see the module docstring)."""
    from vfm_core.tracking import tracking_uri_from

    if flag is not None:
        if not flag.strip():
            raise BackfillError(
                "--tracking-uri is empty: name the run's MLflow store, or leave the flag out "
                "for the run's own"
            )
        return flag, "--tracking-uri"
    if backlog.tracking_uri:
        return backlog.tracking_uri, f"{run_dir / BACKLOG_FILE} tracking_uri"
    if uri := _configured_uri(run_dir / "config.yaml"):
        return uri, f"{run_dir / 'config.yaml'} tracking.tracking_uri"
    return tracking_uri_from(None, "", create=False)  # what the run fell back to


def _run_client(uri: str, source: str, run_id: str):
    """An MLflow client on the existing store at ``uri`` that holds ``run_id``."""
    import mlflow
    from mlflow.exceptions import MlflowException

    from vfm_core.tracking import open_store, refuse_missing_store

    refuse_missing_store(uri, source, "a backfill only adds to a run the store holds")
    open_store(uri, source=source)  # one line if down
    client = mlflow.MlflowClient(uri)
    try:
        client.get_run(run_id)
    except MlflowException as e:
        raise BackfillError(
            f"MLflow run {run_id} is not in the store {uri} ({source}): "
            f"{_first_line(e.message)}; name the run's store with --tracking-uri"
        ) from None
    return client


def _load_backlog(run_dir: Path) -> Backlog:
    """The backlog file, else one built from ``summary.json`` (status '': left as it is)."""
    backlog_path, summary_path = run_dir / BACKLOG_FILE, run_dir / "summary.json"
    if backlog_path.exists():
        return Backlog.read(backlog_path)
    if not summary_path.exists():
        raise BackfillError(
            f"{run_dir}: no {BACKLOG_FILE} and no summary.json (not a training run directory, "
            "or one that never started)"
        )
    run_id = _json_object(summary_path).get("mlflow_run_id")
    if not run_id:
        raise BackfillError(f"{summary_path}: the run logged to no MLflow run (no mlflow_run_id)")
    if not isinstance(run_id, str):
        raise BackfillError(f"{summary_path}: mlflow_run_id is {run_id!r}, not a run id string")
    return Backlog(run_id=run_id, tracking_uri="", status="")


def _missing_metrics(client, run_id: str, metrics_path: Path) -> list:
    """The values of ``metrics.jsonl`` whose (key, step) the MLflow run lacks."""
    from mlflow.entities import Metric

    rows = _jsonl_rows(metrics_path) if metrics_path.exists() else []
    keys = sorted({k for r in rows for k in r if k != "step"})
    have = {k: {m.step for m in client.get_metric_history(run_id, k)} for k in keys}
    ts = int(os.path.getmtime(metrics_path) * 1000) if rows else 0
    return [
        Metric(k, float(v), ts, r["step"])
        for r in rows
        for k, v in r.items()
        if k != "step" and r["step"] not in have[k]
    ]


def _send_artifacts(client, run_id: str, paths: list[str]) -> list[str]:
    """Upload the artifacts that exist; the others are named in one warning line each and
    returned."""
    gone = []
    for a in paths:
        if not Path(a).exists():
            gone.append(a)
            print(f"warning: artifact {a} of MLflow run {run_id} no longer exists", file=sys.stderr)
        elif Path(a).is_dir():
            client.log_artifacts(run_id, a, artifact_path=Path(a).name)
        else:
            client.log_artifact(run_id, a)
    return gone


def _send(client, backlog: Backlog, run_dir: Path) -> tuple[int, list[str]]:
    """Metrics, tags, artifacts and end status; (metric values sent, artifacts not found)."""
    missing = _missing_metrics(client, backlog.run_id, run_dir / "metrics.jsonl")
    for i in range(0, len(missing), BATCH):
        client.log_batch(backlog.run_id, metrics=missing[i : i + BATCH])
    for k, v in backlog.tags.items():
        client.set_tag(backlog.run_id, k, v)
    gone = _send_artifacts(client, backlog.run_id, backlog.artifacts)
    if backlog.status and backlog.status != "RUNNING":
        client.set_terminated(backlog.run_id, status=backlog.status)
    return len(missing), gone


def backfill(run_dir: str | Path, *, tracking_uri: str | None = None) -> dict[str, Any]:
    """Send what the training run in ``run_dir`` could not send to its MLflow run (see the
    module docstring); returns ``{"run_id", "tracking_uri", "metrics", "tags", "artifacts",
    "missing_artifacts", "status"}`` (counts sent, the paths not found, the status set). Without
    a backlog file the run named by ``summary.json`` gets the steps it lacks (nothing else
    changes). Safe to run again."""
    from mlflow.exceptions import MlflowException

    run_dir = Path(run_dir)
    backlog = _load_backlog(run_dir)
    uri, source = _run_store(run_dir, tracking_uri, backlog)
    client = _run_client(uri, source, backlog.run_id)
    try:
        sent, gone = _send(client, backlog, run_dir)
    except MlflowException as e:
        raise BackfillError(
            f"MLflow store {uri} ({source}) refused what {run_dir} sends to run "
            f"{backlog.run_id}: {_first_line(e.message)}"
        ) from None
    done = {
        "run_id": backlog.run_id,
        "tracking_uri": uri,
        "metrics": sent,
        "tags": len(backlog.tags),
        "artifacts": len(backlog.artifacts) - len(gone),
        "missing_artifacts": gone,
        "status": backlog.status or None,
    }
    _settle_backlog(run_dir / BACKLOG_FILE, backlog, uri, gone)
    return done


def _settle_backlog(path: Path, backlog: Backlog, uri: str, gone: list[str]) -> None:
    """Remove the backlog file, or keep it naming only the artifacts not found (one warning)."""
    if not gone:
        path.unlink(missing_ok=True)
        return
    kept = Backlog(
        run_id=backlog.run_id,
        tracking_uri=uri,
        status=backlog.status or "RUNNING",
        artifacts=gone,
        since=backlog.since,
        reason=backlog.reason or "artifacts not found by vfm track backfill",
    )
    kept.write(path)
    print(
        f"warning: {len(gone)} artifact(s) not sent: {path} keeps naming them (restore them and "
        "run again, or delete it to give them up)",
        file=sys.stderr,
    )
