"""The scaling study under a real (ephemeral) Prefect API: one MLflow run per layout, tagged with
the study, then the report (table + PNGs) as artifacts; `vfm report` prints the same table."""

from __future__ import annotations

import json

import pytest

from flows.scaling import LayoutSpec, ScalingParams, scaling_flow
from vfm_core.cli import main as vfm

TINY = [
    "model.hidden=64",
    "model.depth=2",
    "model.heads=4",
    "model.adaln_lora_rank=16",
    "data.batch_size=2",
    "data.latent_frames=2",
    "data.latent_height=8",
    "data.latent_width=8",
]


@pytest.mark.slow
def test_scaling_study_runs_and_reports(prefect_api, tmp_path, capsys):
    import mlflow

    params = ScalingParams(
        study="t-study",
        steps=4,
        overrides=TINY,
        out_dir=str(tmp_path),
        experiment="t-scaling",
        layouts=[LayoutSpec(), LayoutSpec(nproc=2, dp_shard=2)],
    )
    out = scaling_flow(params)
    assert [r["layout"] for r in out["runs"]] == ["1proc", "dp_shard2"]
    rows = json.loads((tmp_path / "report" / "rows.json").read_text())
    assert {r["layout"]: r["world"] for r in rows} == {"1proc": 1, "dp_shard2": 2}
    single = next(r for r in rows if r["world"] == 1)
    assert single["scaling_eff"] == pytest.approx(1.0)
    for r in rows:
        assert r["tokens_per_s"] > 0 and 0 < r["mfu"] < 1
        assert r["predicted"] is not None and r["predicted"] > 0
    # the calibration is fitted to the 1-process run, so the planner reproduces it
    assert single["predicted"] == pytest.approx(single["tokens_per_s"], rel=0.05)
    assert (tmp_path / "report" / "throughput.png").stat().st_size > 1000

    # the study is one parent run holding the comparison (table + plots), a child per layout
    client = mlflow.MlflowClient()
    study = client.get_run(out["mlflow_run_id"])
    assert out["report"]["report_run_id"] == out["mlflow_run_id"]
    assert study.data.tags["vfm.study"] == "t-study" and study.info.status == "FINISHED"
    assert study.info.run_name == "study t-study: dit-tiny x 2 layouts"
    names = {a.path for a in client.list_artifacts(study.info.run_id, "report")}
    assert {
        "report/report.md",
        "report/throughput.png",
        "report/efficiency.png",
        "report/scaling.json",
    } <= names
    children = [client.get_run(r["mlflow_run_id"]) for r in out["runs"]]
    assert [c.data.tags["mlflow.parentRunId"] for c in children] == [study.info.run_id] * 2
    assert [c.info.run_name for c in children] == [
        "dit-tiny 1proc 4 steps",
        "dit-tiny dp_shard2 4 steps",
    ]
    exp = client.get_experiment(study.info.experiment_id)
    assert exp.tags["mlflow.experimentKind"] == "custom_model_development"  # training runs

    capsys.readouterr()
    assert vfm(["report", "--study", "t-study", "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert sorted(r["layout"] for r in printed) == ["1proc", "dp_shard2"]


def test_report_of_unknown_study_is_a_clear_error(capsys):
    assert vfm(["report", "--study", "no-such-study"]) == 2
    assert "no finished MLflow runs tagged vfm.study='no-such-study'" in capsys.readouterr().err


def test_layout_form_rejects_bad_values():
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="nproc"):
        LayoutSpec(nproc=0)
    with pytest.raises(ValidationError, match="recipe"):
        ScalingParams(recipe="dit-huge")
