"""Prefect task around the scaling report: one call of :func:`vfm_core.perf.report.build_report`,
its files logged as artifacts of a report run in MLflow; returns the small summary."""

from __future__ import annotations

from typing import Any

from prefect import task

from tasks.logs import task_logger
from vfm_core.config import TrackingConfig
from vfm_core.tracking import STUDY_TAG, create_run


@task(name="scaling-report", retries=1, retry_delay_seconds=2)
def scaling_report_task(study: str, out_dir: str, tracking: TrackingConfig) -> dict[str, Any]:
    """Build the study's table and plots; log them to an MLflow run tagged with the study."""
    import mlflow

    from vfm_core.perf.report import build_report  # imports torch: only inside the task

    logger = task_logger()
    summary = build_report(study, out_dir)
    run_id = create_run(tracking, tags={STUDY_TAG: study, "vfm.kind": "report"})
    client = mlflow.MlflowClient()
    for path in summary["files"]:
        client.log_artifact(run_id, path, artifact_path="report")
    client.set_terminated(run_id)
    logger.info("scaling study %s:\n%s", study, summary["table"])
    return {**summary, "report_run_id": run_id}
