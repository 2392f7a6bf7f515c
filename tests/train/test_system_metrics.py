"""A training run's MLflow run carries the machine's use (``system/...`` metrics: CPU, memory,
disk, network) next to the training metrics; ``tracking.system_metrics=false`` leaves them out."""

from __future__ import annotations

import mlflow
import pytest

from tests.tiny_runs import TINY_CPU
from vfm_core.config import apply_overrides
from vfm_core.recipes import get_recipe
from vfm_core.train.main import run_training

TINY = [
    *TINY_CPU,
    "train.steps=3",
    "train.ckpt_every=100",
    "tracking.mlflow=true",
    "tracking.experiment=system-metrics",
]


@pytest.mark.parametrize("on", [True, False])
def test_training_run_has_system_metrics(tmp_path, monkeypatch, on):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)  # restored after (mlflow exports it too)
    monkeypatch.setenv("MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL", "0.05")
    monkeypatch.delenv("MLFLOW_RUN_ID", raising=False)
    cfg = apply_overrides(get_recipe("dit-tiny"), [*TINY, f"tracking.system_metrics={on}"])
    summary = run_training(cfg, out_dir=tmp_path / "run", progress=False)
    run = mlflow.MlflowClient(uri).get_run(summary["mlflow_run_id"])
    assert run.info.status == "FINISHED" and "loss" in run.data.metrics
    system = {k for k in run.data.metrics if k.startswith("system/")}
    if on:
        assert {"system/cpu_utilization_percentage", "system/system_memory_usage_megabytes"} <= (
            system
        ), sorted(run.data.metrics)
    else:
        assert not system
