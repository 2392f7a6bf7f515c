"""Logging a run to MLflow: :class:`MLflowLogger` (what a training run and an evaluation log),
which goes on when the tracking server stops answering and names what is unsent in a backlog
(:mod:`vfm_core.tracking_backlog`)."""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from typing import Any

from vfm_core.config import TrackingConfig
from vfm_core.tracking import (
    PREVIOUS_RUN_TAG,
    create_run,
    ensure_experiment,
    run_exists,
    tracking_uri,
    ui_hint,
)


class MLflowLogger:
    """Logs params and metrics to an MLflow run: the run id saved in a checkpoint on resume,
    $MLFLOW_RUN_ID (set by a flow that created the run), or a new run. A resumed run whose MLflow
    run is not in the current store (the run started against a tracking server that is gone) goes
    on in $MLFLOW_RUN_ID's run or a new one, tagged ``vfm.previous_run_id`` with the old id, and
    says so in one warning line. ``system_metrics``: the machine's CPU, memory, disk, network
    (and GPU) use logged as ``system/...`` metrics by MLflow's monitor thread while the run is
    open (every $MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL s, default 10; needs psutil).

    A tracking server that stops answering mid-run never stops training: MLflow's HTTP retries
    are bounded (:data:`HTTP_LIMITS`, unless the user set them), the metrics, tags and artifacts
    are kept in memory (``metrics.jsonl`` has the steps anyway) and sent when the server answers
    again (a 2 s ``/health`` probe at most every :attr:`retry_s` seconds; one warning line when
    it goes, one when it is back). What is still unsent when the run ends is named in
    ``backlog`` (``RUN_DIR/mlflow_backlog.json``), sent later by ``vfm track backfill RUN_DIR``."""

    HTTP_LIMITS = {
        "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2",
        "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
        "MLFLOW_HTTP_REQUEST_TIMEOUT": "20",
    }
    """MLflow's HTTP retry settings for training (its defaults wait minutes on a dead server):
    one failed call costs a few seconds."""
    MAX_BUFFERED = 200_000
    """Metric values kept in memory while the server is away; beyond, the oldest are dropped
    from memory (still in ``metrics.jsonl``, sent by the backfill)."""

    def __init__(
        self,
        cfg: TrackingConfig,
        *,
        run_id: str | None = None,
        tags: dict | None = None,
        name: str | None = None,
        system_metrics: bool = False,
        backlog: str | Path | None = None,
        retry_s: float = 30.0,
    ):
        import mlflow

        self._mlflow = mlflow
        self.uri = tracking_uri(cfg)
        if self.uri.startswith(("http://", "https://")):
            for k, v in self.HTTP_LIMITS.items():
                os.environ.setdefault(k, v)
        ensure_experiment(cfg)
        self.client = mlflow.MlflowClient()
        tags = dict(tags or {})
        previous = None
        if run_id and not run_exists(run_id):
            previous, run_id = run_id, None
            tags[PREVIOUS_RUN_TAG] = previous
        self.run_id = run_id or os.environ.get("MLFLOW_RUN_ID")
        if self.run_id:  # a run created by the flow (or resumed): add what only the trainer knows
            for k, v in tags.items():
                self.client.set_tag(self.run_id, k, v)
        else:
            self.run_id = create_run(cfg, tags=tags, name=name)
        if previous:
            print(
                f"warning: MLflow run {previous} of the checkpoint is not in (or deleted from) the "
                f"tracking store {tracking_uri(cfg)}; logging to run {self.run_id} instead, "
                f"tagged {PREVIOUS_RUN_TAG}={previous}",
                file=sys.stderr,
            )
        # a resumed run re-runs the steps after its checkpoint: those the run has are not sent
        # again (bit-identical values; MLflow would keep both points of a step)
        self.sent_until = _last_step(self.client, self.run_id) if run_id else 0
        self.client.update_run(self.run_id, status="RUNNING")
        self.ui_hint = ui_hint(cfg)
        self.backlog_path = Path(backlog) if backlog is not None else None
        self.retry_s = retry_s
        self._metrics: list = []  # Metric entities not yet sent
        self._tags: dict[str, str] = {}
        self._artifacts: list[str] = []
        self._dropped = 0  # buffered values dropped from memory (MAX_BUFFERED)
        self._down_since: float | None = None  # when the server stopped answering
        self._reason = ""
        self._next_try = 0.0
        self._closed: str | None = None  # the status close() ended the run with
        self.monitor = None
        if system_metrics:
            self.monitor = _system_metrics_monitor(self.run_id, tracking_uri(cfg))

    # ------------------------------------------------------------ sending, or keeping for later
    @property
    def offline(self) -> bool:
        """Whether the server stopped answering and has not answered since."""
        return self._down_since is not None

    def _answers(self) -> bool:
        """A quick look at the server (``/health``, 2 s, no retries); stores other than http(s)
        always answer (their errors are real errors)."""
        import urllib.error
        import urllib.request

        if not self.uri.startswith(("http://", "https://")):
            return True
        try:
            urllib.request.urlopen(self.uri.rstrip("/") + "/health", timeout=2).close()
        except urllib.error.HTTPError:
            return True  # something answered
        except (urllib.error.URLError, OSError, ValueError):
            return False
        return True

    def _went_away(self, e: BaseException) -> None:
        import time

        if self._down_since is None:
            self._down_since = time.time()
            self._reason = f"{type(e).__name__}: {str(e).strip().splitlines()[0][:300]}"
            print(
                f"warning: MLflow server {self.uri} does not answer ({self._reason[:200]}); "
                f"training goes on, metrics stay in metrics.jsonl and are sent when it is back "
                f"(checked every {self.retry_s:g} s)",
                file=sys.stderr,
            )
        self._next_try = time.monotonic() + self.retry_s

    def _send(self, fn, *args, **kwargs) -> bool:
        """Call ``fn``; False (and offline) when the server does not answer. An error from a
        server that answers is raised (a bad request is not an outage)."""
        try:
            fn(*args, **kwargs)
        except Exception as e:
            if self._answers():
                raise
            self._went_away(e)
            return False
        return True

    def flush(self, *, force: bool = False) -> bool:
        """Send what is buffered: at once when online or ``force``, else once the retry time
        has come and the server answers its health probe. True when nothing is left."""
        import time

        if self.offline and not force:
            if time.monotonic() < self._next_try:
                return False
            if not self._answers():
                self._next_try = time.monotonic() + self.retry_s
                return False
        was_down, n = self._down_since, len(self._metrics)
        while self._metrics:
            chunk = self._metrics[:1000]
            if not self._send(self.client.log_batch, self.run_id, metrics=chunk):
                return False
            del self._metrics[: len(chunk)]
        for k in list(self._tags):
            if not self._send(self.client.set_tag, self.run_id, k, self._tags[k]):
                return False
            del self._tags[k]
        while self._artifacts:
            if not self._send(self.client.log_artifact, self.run_id, self._artifacts[0]):
                return False
            self._artifacts.pop(0)
        self._down_since = None
        if was_down is not None:
            print(
                f"MLflow server {self.uri} is back after {time.time() - was_down:.0f} s: sent "
                f"{n} buffered metric values"
                + (
                    f" ({self._dropped} dropped from memory: run the backfill)"
                    if self._dropped
                    else ""
                ),
                file=sys.stderr,
            )
        return True

    def log_params(self, params: dict[str, Any]) -> None:
        from mlflow.entities import Param

        existing = self.client.get_run(self.run_id).data.params
        new = [Param(k, str(v)[:6000]) for k, v in params.items() if k not in existing]
        for i in range(0, len(new), 100):
            self.client.log_batch(self.run_id, params=new[i : i + 100])

    def log(self, step: int, metrics: dict[str, float]) -> None:
        from mlflow.entities import Metric

        if step <= self.sent_until:
            return
        ts = int(self._mlflow.utils.time.get_current_time_millis())
        self._metrics += [Metric(k, float(v), ts, step) for k, v in metrics.items()]
        if len(self._metrics) > self.MAX_BUFFERED:
            extra = len(self._metrics) - self.MAX_BUFFERED
            del self._metrics[:extra]
            self._dropped += extra
        self.flush()

    def log_artifact(self, path: str | Path) -> None:
        self._artifacts.append(str(path))
        self.flush()

    def set_tag(self, key: str, value: str) -> None:
        self._tags[key] = value
        if not self.flush() and self._closed is not None:
            self._write_backlog()

    def _write_backlog(self) -> None:
        """Name what is unsent in the backlog file (or say it is lost without one)."""
        from vfm_core.tracking_backlog import Backlog

        if self.backlog_path is None:
            print(
                f"warning: MLflow run {self.run_id} at {self.uri} misses "
                f"{len(self._metrics) + self._dropped} metric values, {len(self._tags)} tags, "
                f"{len(self._artifacts)} artifacts (the server did not come back)",
                file=sys.stderr,
            )
            return
        Backlog(
            run_id=self.run_id,
            tracking_uri=self.uri,
            status=self._closed or "RUNNING",
            tags=dict(self._tags),
            artifacts=list(self._artifacts),
            since=self._down_since or 0.0,
            reason=self._reason,
        ).write(self.backlog_path)

    def close(self, status: str = "FINISHED") -> None:
        if self.monitor is not None:  # its last samples written before the run ends
            self.monitor.finish()
            self.monitor = None
        self._closed = status
        if self.flush(force=True) and self._send(
            self.client.set_terminated, self.run_id, status=status
        ):
            if self.backlog_path is not None:
                self.backlog_path.unlink(missing_ok=True)
            return
        self._write_backlog()
        where = self.backlog_path.parent if self.backlog_path is not None else "RUN_DIR"
        print(
            f"warning: MLflow server {self.uri} did not come back before the run ended: MLflow "
            f"run {self.run_id} is not complete ({self.backlog_path or 'no backlog file'}); "
            f"when the server answers, run: vfm track backfill {where}",
            file=sys.stderr,
        )


def _system_metrics_monitor(run_id: str, uri: str):
    """MLflow's system-metrics thread for ``run_id``, started (None, with one warning line,
    where psutil is missing); its "started / stopping" INFO lines are left out."""
    try:
        import psutil  # noqa: F401  (the monitors need it; mlflow does not depend on it)
        from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor
    except ImportError as e:
        print(f"warning: no system metrics for MLflow run {run_id} ({e})", file=sys.stderr)
        return None
    logging.getLogger("mlflow.system_metrics").setLevel(logging.WARNING)
    # a resumed run goes on after its last system/ step
    monitor = SystemMetricsMonitor(run_id, resume_logging=True, tracking_uri=uri)
    monitor.start()
    return monitor


def _last_step(client, run_id: str) -> int:
    """The last step of ``run_id``'s ``loss`` history (0: none, or the store does not answer)."""
    try:
        return max((m.step for m in client.get_metric_history(run_id, "loss")), default=0)
    except Exception:  # a server away: nothing skipped, the buffer sends later
        return 0
