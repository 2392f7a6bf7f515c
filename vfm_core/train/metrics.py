"""Metric loggers: metrics.jsonl (the run's own record), console progress bar, MLflow.

Metric keys are one vocabulary everywhere: ``loss``, ``grad_norm``, ``lr``, ``tokens_per_s``,
``tflops``, ``mfu``, ``data_wait``, ``step_time``, ``peak_mem_gb``, and with a blend of datasets
``data/samples/<name>`` (samples drawn from each so far). Only rank 0 logs.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any, Protocol

from tqdm import tqdm

from vfm_core.config import TrackingConfig
from vfm_core.tracking import create_run, ensure_experiment, ui_hint


class MetricLogger(Protocol):
    def log_params(self, params: dict[str, Any]) -> None: ...

    def log(self, step: int, metrics: dict[str, float]) -> None: ...

    def close(self) -> None: ...


class JsonlLogger:
    """Appends one JSON object per logged step to ``metrics.jsonl``. On resume from step S, lines
    after S (logged by a run that crashed before its next checkpoint) are dropped so the file holds
    each step once."""

    def __init__(self, path: str | Path, *, resume_step: int | None = None):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if resume_step is None:
            self.path.write_text("")
        elif self.path.exists():
            keep = [
                ln
                for ln in self.path.read_text().splitlines()
                if ln.strip() and json.loads(ln)["step"] <= resume_step
            ]
            self.path.write_text("".join(ln + "\n" for ln in keep))
        self._f = self.path.open("a")

    def log_params(self, params: dict[str, Any]) -> None:
        pass

    def log(self, step: int, metrics: dict[str, float]) -> None:
        self._f.write(json.dumps({"step": step, **metrics}) + "\n")
        self._f.flush()

    def close(self) -> None:
        self._f.close()


class ConsoleLogger:
    """Progress on stderr: a tqdm bar on a terminal, else one line every ~5% of the steps (so a
    log collected by a Prefect task still shows progress)."""

    def __init__(self, total: int, *, initial: int = 0, bar: bool = True):
        self.total, self.bar = total, None
        self.every = max(1, total // 20)
        if bar:
            self.bar = tqdm(
                total=total, initial=initial, unit="step", dynamic_ncols=True, desc="train"
            )

    def log_params(self, params: dict[str, Any]) -> None:
        pass

    def log(self, step: int, metrics: dict[str, float]) -> None:
        if self.bar is not None:
            self.bar.update(step - self.bar.n)
            self.bar.set_postfix(
                loss=f"{metrics['loss']:.4f}",
                tok_s=f"{metrics['tokens_per_s']:.0f}",
                mfu=f"{metrics['mfu']:.1%}",
                refresh=False,
            )
        elif step % self.every == 0 or step == self.total:
            print(
                f"step {step}/{self.total} loss {metrics['loss']:.4f} "
                f"{metrics['tokens_per_s']:.0f} tokens/s {metrics['tflops'] * 1e3:.1f} GFLOP/s "
                f"MFU {metrics['mfu']:.1%}",
                file=sys.stderr,
                flush=True,
            )

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


class MLflowLogger:
    """Logs params and metrics to an MLflow run: $MLFLOW_RUN_ID (set by a flow that created the
    run),
    the run id saved in a checkpoint on resume, or a new run."""

    def __init__(
        self,
        cfg: TrackingConfig,
        *,
        run_id: str | None = None,
        tags: dict | None = None,
        name: str | None = None,
    ):
        import mlflow

        self._mlflow = mlflow
        ensure_experiment(cfg)
        self.client = mlflow.MlflowClient()
        self.run_id = run_id or os.environ.get("MLFLOW_RUN_ID")
        if self.run_id:  # a run created by the flow (or resumed): add what only the trainer knows
            for k, v in (tags or {}).items():
                self.client.set_tag(self.run_id, k, v)
        else:
            self.run_id = create_run(cfg, tags=tags, name=name)
        self.client.update_run(self.run_id, status="RUNNING")
        self.ui_hint = ui_hint(cfg)

    def log_params(self, params: dict[str, Any]) -> None:
        from mlflow.entities import Param

        existing = self.client.get_run(self.run_id).data.params
        new = [Param(k, str(v)[:6000]) for k, v in params.items() if k not in existing]
        for i in range(0, len(new), 100):
            self.client.log_batch(self.run_id, params=new[i : i + 100])

    def log(self, step: int, metrics: dict[str, float]) -> None:
        from mlflow.entities import Metric

        ts = int(self._mlflow.utils.time.get_current_time_millis())
        self.client.log_batch(
            self.run_id, metrics=[Metric(k, float(v), ts, step) for k, v in metrics.items()]
        )

    def log_artifact(self, path: str | Path) -> None:
        self.client.log_artifact(self.run_id, str(path))

    def set_tag(self, key: str, value: str) -> None:
        self.client.set_tag(self.run_id, key, value)

    def close(self, status: str = "FINISHED") -> None:
        self.client.set_terminated(self.run_id, status=status)


def fit_and_close(
    trainer, loggers: list, *, checkpoint, mlflow: MLflowLogger | None, out: Path
) -> dict[str, float]:
    """Run ``trainer.fit`` and close every logger whatever happens; the MLflow run gets the run's
    config and metrics file as artifacts and ends FINISHED or FAILED."""
    status = "FAILED"
    try:
        last = trainer.fit(loggers=loggers, checkpoint=checkpoint)
        status = "FINISHED"
    finally:
        for lg in loggers:
            if lg is mlflow:
                for name in ("config.yaml", "metrics.jsonl"):
                    mlflow.log_artifact(out / name)
                mlflow.close(status)
            else:
                lg.close()
    return last
