"""MLflow plumbing shared by the trainer and the Prefect layer (no torch import here).

Default store: sqlite under the project data dir (``$VFM_DATA_DIR`` or ``./data``), artifacts beside
it — the MLflow 3.17 file store is in maintenance mode and refuses by default.
"""

from __future__ import annotations

import os
import warnings
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


def fail_run(run_id: str, error: BaseException | str) -> None:
    """End a run as FAILED with the error (its first line, 500 characters) as the tag
    ``vfm.error``, so a failed launch never leaves a run RUNNING forever."""
    import mlflow

    text = str(error).strip().splitlines()[0][:500] if str(error).strip() else type(error).__name__
    client = mlflow.MlflowClient()
    client.set_tag(run_id, "vfm.error", text)
    client.set_terminated(run_id, status="FAILED")


def ui_hint(cfg: TrackingConfig | None = None) -> str:
    """Where a person looks at the runs: the server's URL, or the command serving a local store."""
    uri = tracking_uri(cfg)
    if uri.startswith(("http://", "https://")):
        return f"open {uri}"
    return f"mlflow ui --backend-store-uri {uri} --host 127.0.0.1"


def log_lineage(
    run_id: str, *, experiment: str, clips: str, shards: str, tokenizer: str | None = None
) -> None:
    """Record where a training run's data came from: the curation manifest (``clips.parquet``)
    and the shard index as MLflow dataset inputs (with digests), plus ``vfm.*`` tags."""
    import mlflow
    import polars as pl
    from mlflow.entities import DatasetInput, InputTag

    ensure_experiment(TrackingConfig(experiment=experiment))
    client = mlflow.MlflowClient()
    inputs = []
    for name, source, frame in (
        ("clips", clips, pl.read_parquet(clips).to_pandas()),
        ("shards", shards, _index_frame(shards)),
    ):
        with warnings.catch_warnings():  # schema inference hints about integer columns
            warnings.simplefilter("ignore", UserWarning)
            entity = mlflow.data.from_pandas(frame, source=source, name=name)._to_mlflow_entity()
        inputs.append(DatasetInput(entity, tags=[InputTag("mlflow.data.context", "training")]))
    client.log_inputs(run_id, datasets=inputs)
    tags = {"vfm.clips_manifest": clips, "vfm.shards_index": shards}
    if tokenizer:
        tags["vfm.tokenizer"] = tokenizer
    for k, v in tags.items():
        client.set_tag(run_id, k, v)


def _index_frame(index_url: str):
    """The shard index as a table (one row per shard) for MLflow's dataset digest."""
    import json

    import pandas as pd

    from vfm_core.storage import read_bytes

    index = json.loads(read_bytes(index_url))
    shards = index.get("shards", [])
    return pd.DataFrame(shards) if shards else pd.DataFrame({"index": [index_url]})
