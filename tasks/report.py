"""Prefect tasks around the reports, each one call of its vfm_core builder: the scaling report
(:func:`vfm_core.perf.report.build_report`, its files logged as artifacts of a report run in
MLflow; returns the small summary) and the end-to-end pipeline's report
(:func:`vfm_core.pipeline_report.pipeline_report`: ``report.md`` and a Prefect artifact)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from prefect import task
from prefect.artifacts import create_markdown_artifact

from tasks.logs import task_logger
from tasks.retry import unless_input_error
from vfm_core.config import TrackingConfig
from vfm_core.pipeline_report import pipeline_report
from vfm_core.tracking import ensure_experiment


@task(
    name="scaling-report", retries=1, retry_delay_seconds=2, retry_condition_fn=unless_input_error
)
def scaling_report_task(
    study: str, out_dir: str, tracking: TrackingConfig, run_id: str
) -> dict[str, Any]:
    """Build the study's table and plots; log them as artifacts (``report/``) of the study's run
    ``run_id`` and the table as MLflow table ``report/scaling.json`` (rows comparable in the UI)."""
    import mlflow
    import pandas as pd

    from vfm_core.perf.report import build_report  # imports torch: only inside the task

    logger = task_logger()
    summary = build_report(study, out_dir)
    ensure_experiment(tracking)
    client = mlflow.MlflowClient()
    for path in summary["files"]:
        client.log_artifact(run_id, path, artifact_path="report")
    rows = json.loads(Path(summary["dir"], "rows.json").read_text())
    if rows:  # the artifact view shows it as a sortable table
        client.log_table(run_id, data=pd.DataFrame(rows), artifact_file="report/scaling.json")
    logger.info("scaling study %s:\n%s", study, summary["table"])
    return {**summary, "report_run_id": run_id}


@task(name="pipeline-report")
def pipeline_report_task(
    stages: dict[str, Any], *, name: str, recipe: str, experiment: str, parent_run_id: str
) -> str:
    """Write the pipeline's report (:func:`vfm_core.pipeline_report.pipeline_report`) to
    ``WORK/report.md`` and as a Prefect markdown artifact; returns its text."""
    text = pipeline_report(
        stages, name=name, recipe=recipe, experiment=experiment, parent_run_id=parent_run_id
    )
    Path(stages["work_dir"], "report.md").write_text(text + "\n")
    create_markdown_artifact(
        text,
        key=f"pipeline-{name.lower().replace('_', '-')}".replace(".", "-"),
        description="vfm pipeline summary",
    )
    return text
