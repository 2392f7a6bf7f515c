"""Prefect tasks around MLflow runs: create one (tagged with the Prefect flow run that made it,
the code's commit, nested under a parent), attach files, end it FINISHED or FAILED with the error.

Every flow creates and ends its runs through these, so a run in the MLflow UI always links back to
its Prefect flow run (``vfm.prefect_flow_run_url``) and never stays RUNNING after a failure.
"""

from __future__ import annotations

from pathlib import Path

from prefect import task

from tasks.retry import unless_input_error
from vfm_core.config import TrackingConfig
from vfm_core.tracking import create_run, ensure_experiment, fail_run


def prefect_tags() -> dict[str, str]:
    """The current Prefect flow run as MLflow tags (empty outside a flow run)."""
    from prefect.runtime import flow_run

    run_id = flow_run.get_id()
    if not run_id:
        return {}
    tags = {
        "vfm.prefect_flow_run_id": str(run_id),
        "vfm.prefect_flow_run": flow_run.get_name() or "",
        "vfm.prefect_flow": flow_run.get_flow_name() or "",
    }
    from prefect.utilities.urls import url_for

    url = url_for("flow-run", obj_id=str(run_id))  # the UI's route (runs/flow-run/ID)
    if url and url.startswith("http"):  # an ephemeral API has no UI to link to
        tags["vfm.prefect_flow_run_url"] = url
    return tags


@task(name="mlflow-run", retries=2, retry_delay_seconds=2, retry_condition_fn=unless_input_error)
def start_mlflow_run(
    tracking: TrackingConfig,
    tags: dict[str, str],
    *,
    parent_run_id: str | None = None,
    name: str | None = None,
) -> str:
    """Create the MLflow run a stage logs to (training ranks attach through MLFLOW_RUN_ID)."""
    return create_run(
        tracking, tags={**prefect_tags(), **tags}, parent_run_id=parent_run_id, name=name
    )


@task(name="mlflow-log", retries=2, retry_delay_seconds=2, retry_condition_fn=unless_input_error)
def log_to_run(
    tracking: TrackingConfig,
    run_id: str,
    files: list[str],
    *,
    artifact_path: str | None = None,
    tags: dict[str, str] | None = None,
    params: dict[str, object] | None = None,
    metrics: dict[str, float] | None = None,
    step: int = 0,
) -> None:
    """Attach existing ``files`` (missing ones are skipped), ``tags``, ``params`` and ``metrics``
    (at ``step``) to the run."""
    import mlflow
    from mlflow.entities import Metric, Param

    ensure_experiment(tracking)
    client = mlflow.MlflowClient()
    if params:
        client.log_batch(run_id, params=[Param(k, str(v)[:6000]) for k, v in params.items()])
    if metrics:
        ts = int(mlflow.utils.time.get_current_time_millis())
        batch = [Metric(k, float(v), ts, step) for k, v in metrics.items()]
        client.log_batch(run_id, metrics=batch)
    for f in files:
        if Path(f).is_file():
            client.log_artifact(run_id, f, artifact_path=artifact_path)
    for k, v in (tags or {}).items():
        client.set_tag(run_id, k, v)


@task(
    name="mlflow-run-end", retries=2, retry_delay_seconds=2, retry_condition_fn=unless_input_error
)
def end_mlflow_run(tracking: TrackingConfig, run_id: str, error: str | None = None) -> None:
    """End the run FINISHED, or FAILED with ``error`` as the tag ``vfm.error``."""
    import mlflow

    ensure_experiment(tracking)  # points the client at the run's store
    if error is None:
        mlflow.MlflowClient().set_terminated(run_id, status="FINISHED")
    else:
        fail_run(run_id, error)
