from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from flows.train import TrainParams, train_flow
from tasks.train import train_model
from vfm_core.config import apply_overrides
from vfm_core.recipes import get_recipe

FAST = ["data.batch_size=2", "model.depth=2"]


def test_params_validate():
    with pytest.raises(ValidationError, match="unknown recipe 'nope'"):
        TrainParams(recipe="nope")
    with pytest.raises(ValidationError, match="greater than or equal to 1"):
        TrainParams(steps=0)  # trained nothing and emitted train.completed
    schema = TrainParams.model_json_schema()  # what the Prefect UI renders as a form
    assert {"recipe", "steps", "overrides", "resume"} <= set(schema["properties"])


def test_train_flow_runs_trainer_and_links_mlflow(prefect_api, tmp_path):
    import mlflow

    params = TrainParams(
        steps=4, out_dir=str(tmp_path / "run"), overrides=FAST, experiment="test-flow"
    )
    summary = train_flow(params)
    assert summary["step"] == 4
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").open()]
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    run = mlflow.MlflowClient().get_run(summary["mlflow_run_id"])
    assert run.data.tags["source"] == "prefect"  # the flow created the run, the trainer attached
    assert run.info.status == "FINISHED"
    assert len(mlflow.MlflowClient().get_metric_history(run.info.run_id, "mfu")) == 4
    from prefect.artifacts import Artifact  # the run page's bar followed the step lines to 100%

    bar = Artifact.get("train-progress")
    assert bar is not None and bar.type == "progress" and float(bar.data) == 100.0


def test_bad_flow_overrides_fail_clearly(prefect_api, tmp_path):
    with pytest.raises(ValueError, match="model.hiden: unknown key"):
        train_flow(TrainParams(steps=1, out_dir=str(tmp_path), overrides=["model.hiden=3"]))


def test_train_task_fn_reports_trainer_failure(tmp_path: Path):
    cfg = apply_overrides(get_recipe("dit-tiny"), FAST + ["train.steps=1", "tracking.mlflow=false"])
    summary = train_model.fn(cfg, str(tmp_path / "ok"))
    assert summary["step"] == 1 and summary["mlflow_run_id"] is None
    (tmp_path / "bad" / "checkpoints").mkdir(parents=True)
    with pytest.raises(RuntimeError, match="no checkpoint under"):
        train_model.fn(cfg, str(tmp_path / "bad"), resume=True)


@pytest.mark.slow
def test_train_flow_runs_a_parallel_layout_from_the_form(prefect_api, tmp_path):
    """The form's flat layout fields reach torchrun: TP2 on 2 processes trains the one-process
    run's losses."""
    common = dict(steps=2, overrides=FAST, experiment="test-flow")
    one = train_flow(TrainParams(out_dir=str(tmp_path / "one"), **common))
    two = train_flow(TrainParams(out_dir=str(tmp_path / "tp2"), nproc=2, tp=2, **common))
    assert two["world_size"] == 2 and two["degrees"]["tp"] == 2
    losses = [
        [json.loads(x)["loss"] for x in (tmp_path / d / "metrics.jsonl").open()]
        for d in ("one", "tp2")
    ]
    assert losses[1] == pytest.approx(losses[0], rel=1e-4)
    assert one["final"]["loss"] == pytest.approx(two["final"]["loss"], rel=1e-4)


def test_bad_layouts_in_the_form_fail_before_launch(prefect_api, tmp_path):
    with pytest.raises(ValidationError, match="dp_shard"):
        TrainParams(dp_shard=0)
    with pytest.raises(Exception, match="does not divide the world size 2"):
        train_flow(TrainParams(steps=1, out_dir=str(tmp_path / "x"), nproc=2, tp=4))
    with pytest.raises(Exception, match="--max-restarts 1: restarts resume from the last"):
        train_flow(TrainParams(steps=1, out_dir=str(tmp_path / "y"), max_restarts=1))
    assert not (tmp_path / "x").exists() and not (tmp_path / "y").exists()


def test_resume_without_a_run_name_is_refused_by_the_form():
    """(Runs of the deployment's defaults, each in its own directory, and a failing run ending its
    MLflow run FAILED: tests/infra/test_deployment_e2e.py, on a real server and worker.)"""
    with pytest.raises(ValidationError, match="name the run to continue"):
        TrainParams(resume=True)
