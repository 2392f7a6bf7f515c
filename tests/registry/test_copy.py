"""``vfm models copy`` between two real sqlite stores: a registered, promoted version of the
2-step checkpoint and its runs (pipeline -> training -> evaluation, with metric histories and an
artifact) arrive in the target with their lineage, load there with ``mlflow.pyfunc``, and a second
copy copies nothing; bad inputs are one line."""

from __future__ import annotations

import mlflow
import pytest
from registry_support import EXPERIMENT

from vfm_core.cli import main
from vfm_core.registry import promote, register_checkpoint
from vfm_core.registry.copy import logged_model_id
from vfm_core.tracking import STAGE_TAG, create_run

NAME = "vfm-dit-tiny"
GOOD = {"prompt_colour_acc": 0.5, "prompt_direction_acc": 0.5, "frechet_distance": 10.0}


def _runs(store, tmp_path) -> tuple[str, str, str]:
    """(pipeline, training, evaluation) runs in store A: training nested under the pipeline,
    the evaluation under the training run; a loss history, a param, an artifact."""
    client = mlflow.MlflowClient()
    pipe = create_run(store, tags={STAGE_TAG: "pipeline"}, name="pipeline demo")
    train = create_run(store, tags={STAGE_TAG: "train"}, parent_run_id=pipe, name="dit-tiny 2")
    for step, loss in enumerate([1.0, 0.5, 0.25]):
        client.log_metric(train, "loss", loss, step=step)
    client.log_param(train, "train.steps", "2")
    (tmp_path / "report.md").write_text("# demo\n")
    client.log_artifact(train, str(tmp_path / "report.md"))
    ev = create_run(store, tags={STAGE_TAG: "evaluate"}, parent_run_id=train, name="evaluate")
    client.log_metric(ev, "frechet_distance", 10.0)
    for run in (pipe, train, ev):
        client.set_terminated(run)
    return pipe, train, ev


def test_copy_moves_versions_runs_lineage_and_alias_once(
    trained_run, store, tmp_path, capsys, monkeypatch
):
    a = mlflow.get_tracking_uri()
    pipe, train, ev = _runs(store, tmp_path)
    reg = register_checkpoint(
        trained_run, run_id=train, tracking=store, metrics=GOOD, eval_run_id=ev
    )
    promote(NAME, reg.version)
    b = f"sqlite:///{tmp_path / 'b' / 'b.db'}"

    assert main(["models", "copy", "--from", a, "--to", b, "--dry-run"]) == 0
    assert f"{NAME} v1 -> {b}: would copy, @champion" in capsys.readouterr().out
    assert main(["models", "copy", "--from", a, "--to", b]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"{NAME} v1 -> {b}: runs 3, @champion"  # pipeline, training, evaluation
    assert out[1].startswith(f"copied 1 version(s) of {NAME} from {a} to {b}")

    src, dst = mlflow.MlflowClient(a, a), mlflow.MlflowClient(b, b)
    mv = dst.get_model_version_by_alias(NAME, "champion")
    old = src.get_model_version(NAME, "1")
    assert str(mv.version) == "1" and mv.description == old.description
    assert mv.tags["vfm.copied_from"] == f"{a}#{NAME}/1"
    assert mv.tags["eval.frechet_distance"] == old.tags["eval.frechet_distance"]
    assert mv.tags["vfm.promotion"] == "promoted"
    assert mv.tags["vfm.checkpoint"] == old.tags["vfm.checkpoint"]
    new_train = dst.get_run(mv.run_id)
    assert mv.tags["vfm.source_run"] == mv.run_id != train
    assert new_train.info.run_name == "dit-tiny 2" and new_train.info.status == "FINISHED"
    assert new_train.data.params == {"train.steps": "2"}
    history = dst.get_metric_history(mv.run_id, "loss")
    assert [(m.step, m.value) for m in history] == [(0, 1.0), (1, 0.5), (2, 0.25)]
    assert new_train.data.tags["vfm.copied_from"] == f"{a}#runs/{train}"
    assert [f.path for f in dst.list_artifacts(mv.run_id)] == ["report.md"]
    model_id = logged_model_id(mv)
    assert [o.model_id for o in new_train.outputs.model_outputs] == [model_id]
    assert model_id != logged_model_id(old)
    new_pipe = dst.get_run(new_train.data.tags["mlflow.parentRunId"])
    assert new_pipe.info.run_name == "pipeline demo"
    assert dst.get_experiment(new_pipe.info.experiment_id).name == EXPERIMENT
    new_ev = dst.get_run(mv.tags["vfm.eval_run"])
    assert new_ev.data.tags["mlflow.parentRunId"] == mv.run_id
    old_ev = src.get_run(old.tags["vfm.eval_run"]).data.metrics  # + what registering logged
    assert new_ev.data.metrics == old_ev and old_ev["frechet_distance"] == 10.0

    mlflow.set_tracking_uri(b)
    model = mlflow.pyfunc.load_model(f"models:/{NAME}@champion")
    assert model.metadata.run_id == mv.run_id and model.metadata.model_id == model_id

    # again: nothing copied twice
    assert main(["models", "copy", "--from", a, "--to", b]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out == [f"copied 0 version(s) of {NAME} from {a} to {b} (1 already there)"]
    assert len(dst.search_model_versions(f"name='{NAME}'")) == 1
    assert len(dst.search_runs([new_pipe.info.experiment_id])) == 3

    # a second version, promoted in A: only it is copied, and @champion moves in B too
    mlflow.set_tracking_uri(a)
    train2 = create_run(store, tags={STAGE_TAG: "train"}, parent_run_id=pipe, name="dit-tiny 3")
    reg2 = register_checkpoint(trained_run, run_id=train2, tracking=store, metrics=GOOD)
    assert promote(NAME, reg2.version)["promoted"]
    assert main(["models", "copy", "--from", a, "--to", b]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"{NAME} v2 -> {b}: runs 1, @champion"  # the pipeline run is there already
    mv2 = dst.get_model_version_by_alias(NAME, "champion")
    assert str(mv2.version) == "2" and mv2.tags["vfm.previous_champion"] == "1"
    assert dst.get_run(mv2.run_id).data.tags["mlflow.parentRunId"] == new_pipe.info.run_id

    # bad inputs: one line each (after MLflow's own log lines), nothing made at the target
    c = f"sqlite:///{tmp_path / 'c.db'}"
    cases = {
        ("--from", a, "--to", c, "--name", "nope"): "--name nope: no registered model",
        ("--from", a, "--to", a): "--from and --to are both",
        ("--from", f"sqlite:///{tmp_path / 'none.db'}", "--to", c): "no database at",
        ("--from", a, "--to", "http://127.0.0.1:9"): "no server answers",
    }
    for argv, want in cases.items():
        assert main(["models", "copy", *argv]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert want in err[-1] and err[-1].startswith("vfm models: error:"), err
        assert "Traceback" not in "".join(err)
    assert not (tmp_path / "c.db").exists() and not (tmp_path / "none.db").exists()
    monkeypatch.delenv("MLFLOW_TRACKING_URI")  # the default source is the default target
    assert main(["models", "copy"]) == 2
    assert "--from and --to are both" in capsys.readouterr().err


@pytest.mark.parametrize("argv", [["models"], ["models", "copy", "--nam", "x"]])
def test_parser_errors(argv, capsys):
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2 and len(capsys.readouterr().err.strip().splitlines()) == 1
