"""Helpers of the registry tests (a module name of its own: every test folder has a conftest)."""

from __future__ import annotations

from pathlib import Path

from vfm_core.config import TrackingConfig

EXPERIMENT = "vfm-registry-test"
SMALL = {"frames": 5, "size": "32x32", "steps": 2, "seed": 0}
"""A clip of 5 frames at 32x32 with 2 sampler steps: the cheapest real video."""


def use_store(monkeypatch, folder: Path) -> TrackingConfig:
    """An empty sqlite tracking + registry store in ``folder`` (the model cache beside it) for
    what runs while ``monkeypatch`` holds."""
    uri = f"sqlite:///{folder / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.setenv("VFM_DATA_DIR", str(folder / "data"))
    monkeypatch.setenv("VFM_MODEL_CACHE", str(folder / "cache"))
    monkeypatch.setenv("VFM_NO_SERVICES", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    import mlflow

    mlflow.set_tracking_uri(uri)  # clients made before the first registration see this store
    return TrackingConfig(experiment=EXPERIMENT)


def training_run(tracking: TrackingConfig, name: str = "train") -> str:
    """A finished MLflow run standing for the training run the model is logged in."""
    import mlflow

    from vfm_core.tracking import STAGE_TAG, create_run

    run_id = create_run(tracking, tags={STAGE_TAG: "train"}, name=name)
    mlflow.MlflowClient().set_terminated(run_id)
    return run_id
