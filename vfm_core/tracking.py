"""MLflow plumbing shared by the trainer and the Prefect layer (no torch import here).

Default store: sqlite under the project data dir (``$VFM_DATA_DIR`` or ``./data``), artifacts beside
it — the MLflow 3.17 file store is in maintenance mode and refuses by default.
"""

from __future__ import annotations

import os
from pathlib import Path

from vfm_core.config import TrackingConfig

STUDY_TAG = "vfm.study"
"""MLflow tag naming the scaling study a run belongs to."""
LAYOUT_TAG = "vfm.layout"
"""MLflow tag with a run's parallel layout label (e.g. ``tp2``)."""


def data_dir() -> Path:
    """Project data dir (MLflow store, runs): $VFM_DATA_DIR or ./data."""
    return Path(os.environ.get("VFM_DATA_DIR", "data")).resolve()


def tracking_uri(cfg: TrackingConfig | None = None) -> str:
    """Explicit URI, else $MLFLOW_TRACKING_URI, else the sqlite store under the data dir."""
    if cfg is not None and cfg.tracking_uri:
        return cfg.tracking_uri
    if os.environ.get("MLFLOW_TRACKING_URI"):
        return os.environ["MLFLOW_TRACKING_URI"]
    root = data_dir() / "mlflow"
    root.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{root / 'mlflow.db'}"


def ensure_experiment(cfg: TrackingConfig) -> str:
    """Point MLflow at the store and return the experiment id, creating the experiment with an
    explicit artifact location next to a sqlite store."""
    import mlflow

    uri = tracking_uri(cfg)
    mlflow.set_tracking_uri(uri)
    exp = mlflow.get_experiment_by_name(cfg.experiment)
    if exp is not None:
        return exp.experiment_id
    location = None
    if uri.startswith("sqlite:///"):
        location = (Path(uri.removeprefix("sqlite:///")).parent / "artifacts").as_uri()
    return mlflow.create_experiment(cfg.experiment, artifact_location=location)


def create_run(cfg: TrackingConfig, *, tags: dict[str, str] | None = None) -> str:
    """Create an MLflow run (status RUNNING) and return its id; workers attach via MLFLOW_RUN_ID."""
    import mlflow

    exp_id = ensure_experiment(cfg)
    run = mlflow.MlflowClient().create_run(exp_id, run_name=cfg.run_name or None, tags=tags or {})
    return run.info.run_id


def ui_hint(cfg: TrackingConfig | None = None) -> str:
    """Where a person looks at the runs: the server's URL, or the command serving a local store."""
    uri = tracking_uri(cfg)
    if uri.startswith(("http://", "https://")):
        return f"open {uri}"
    return f"mlflow ui --backend-store-uri {uri} --host 127.0.0.1"
