"""The registry with real parts: a checkpoint trained for 2 steps registered into a sqlite store
(metrics, source run, lineage, checkpoint URI as version tags), the champion alias moved only
when the rule holds, and ``models:/`` URIs used by ``vfm generate``, ``load_dit``, the Prefect
generation task and ``mlflow.pyfunc.load_model``."""

from __future__ import annotations

import mlflow
import pytest
import yaml
from registry_support import training_run

from vfm_core.checkpoints.uri import RegistryError, resolve_model_uri
from vfm_core.registry import promote, register_checkpoint
from vfm_core.video.io import decode_frames, probe

NAME = "vfm-dit-tiny"
GOOD = {"prompt_colour_acc": 0.5, "prompt_direction_acc": 0.5, "frechet_distance": 10.0}


def _register(run, store, metrics, **kw):
    return register_checkpoint(
        run, run_id=training_run(store), tracking=store, metrics=metrics, **kw
    )


def test_register_records_metrics_lineage_source_run_and_first_is_champion(trained_run, store):
    eval_run = training_run(store, "evaluate")
    reg = _register(trained_run, store, {**GOOD, "heldout_loss": 0.7}, eval_run_id=eval_run)
    assert (reg.name, reg.version, reg.model_uri) == (NAME, 1, f"models:/{NAME}/1")
    client = mlflow.MlflowClient()
    mv = client.get_model_version(NAME, "1")
    assert mv.run_id == reg.run_id  # the training run is the version's source run
    tags = mv.tags
    assert float(tags["eval.frechet_distance"]) == 10.0
    assert float(tags["eval.heldout_loss"]) == 0.7
    assert tags["vfm.source_run"] == reg.run_id and tags["vfm.eval_run"] == eval_run
    assert tags["vfm.checkpoint"] == str(trained_run / "checkpoints" / "step_00000002")
    assert tags["vfm.checkpoint_step"] == "2" and tags["vfm.recipe"] == "dit-tiny"
    assert tags["vfm.data_source"] == "synthetic" and tags["vfm.tokenizer"]
    # the run shows the logged model
    assert [o.model_id for o in client.get_run(reg.run_id).outputs.model_outputs] == [reg.model_id]
    assert client.get_run(reg.run_id).info.status == "FINISHED"  # status kept

    out = promote(NAME, 1)
    assert out["promoted"] and "first version" in out["reason"]
    mv = client.get_model_version_by_alias(NAME, "champion")
    assert str(mv.version) == "1" and mv.tags["vfm.promotion"] == "promoted"
    assert "first version" in mv.description
    # registering the same checkpoint from the same run again: the same version
    again = register_checkpoint(
        trained_run, run_id=reg.run_id, tracking=store, metrics={**GOOD, "frechet_distance": 9.0}
    )
    assert again.version == 1 and len(client.search_model_versions(f"name='{NAME}'")) == 1
    assert float(client.get_model_version(NAME, "1").tags["eval.frechet_distance"]) == 9.0
    # without an evaluation run, a changed metric is logged on the model in its source run
    metrics = client.get_logged_model(reg.model_id).metrics
    assert ("eval/frechet_distance", 9.0, reg.run_id) in {
        (m.key, m.value, m.run_id) for m in metrics
    }


def test_shard_lineage_records_index_path_and_sha(tmp_path):
    import hashlib
    import json

    from vfm_core.config import apply_overrides, validate
    from vfm_core.recipes import get_recipe
    from vfm_core.registry.register import lineage_tags

    shards = tmp_path / "shards"
    shards.mkdir()
    (shards / "index.json").write_text(json.dumps({"shards": []}))
    cfg = validate(apply_overrides(get_recipe("dit-tiny"), ["data.source=shards"]))
    cfg.data.shards = str(shards)
    tags = lineage_tags(cfg)
    assert tags["vfm.shards_index"].endswith("shards/index.json")
    want = hashlib.sha256((shards / "index.json").read_bytes()).hexdigest()
    assert tags["vfm.shards_index_sha256"] == want


def test_a_run_started_from_a_registered_model_records_it_and_its_version_keeps_it(
    trained_run, store, tmp_path
):
    """``train.init=models:/NAME@champion``: the new run starts from the version's weights, its
    MLflow run and its own registered version name the parent (model, checkpoint)."""
    import dataclasses

    from vfm_core.config import apply_overrides, load_yaml
    from vfm_core.train.main import run_training

    _register(trained_run, store, GOOD)
    promote(NAME, 1)
    cfg = load_yaml(trained_run / "config.yaml")
    over = [f"train.init=models:/{NAME}@champion", "train.steps=1", "tracking.mlflow=true"]
    cfg = dataclasses.replace(apply_overrides(cfg, over), tracking=store)
    summary = run_training(cfg, out_dir=tmp_path / "child", progress=False)
    client = mlflow.MlflowClient()
    run_tags = client.get_run(summary["mlflow_run_id"]).data.tags
    assert run_tags["vfm.parent_model"] == f"models:/{NAME}@champion"
    assert run_tags["vfm.parent_checkpoint"].endswith(
        "artifacts/checkpoint/checkpoints/step_00000002"
    )
    child = register_checkpoint(tmp_path / "child", run_id=summary["mlflow_run_id"], tracking=store)
    tags = client.get_model_version(NAME, str(child.version)).tags
    assert child.version == 2 and tags["vfm.parent_model"] == f"models:/{NAME}@champion"
    assert tags["vfm.parent_checkpoint"] == run_tags["vfm.parent_checkpoint"]


def test_promotion_moves_alias_only_when_rule_holds(trained_run, store):
    client = mlflow.MlflowClient()
    _register(trained_run, store, GOOD)
    assert promote(NAME, 1)["champion"] == 1
    worse = _register(trained_run, store, {**GOOD, "frechet_distance": 12.0})
    out = promote(NAME, worse.version)
    assert not out["promoted"] and out["champion"] == 1
    assert str(client.get_model_version_by_alias(NAME, "champion").version) == "1"
    tags = client.get_model_version(NAME, str(worse.version)).tags
    assert (
        tags["vfm.promotion"] == "rejected"
        and "frechet_distance 12 vs 10" in tags["vfm.promotion_reason"]
    )
    better = _register(trained_run, store, {**GOOD, "prompt_direction_acc": 0.75})
    out = promote(NAME, better.version)
    assert out["promoted"] and (out["champion"], out["previous"]) == (better.version, 1)
    mv = client.get_model_version_by_alias(NAME, "champion")
    assert str(mv.version) == str(better.version) and mv.tags["vfm.previous_champion"] == "1"
    assert "prompt_direction_acc 0.75 vs 0.5" in mv.description


def test_models_uri_resolves_to_a_cached_run_dir(trained_run, store, tmp_path):
    from vfm_core.checkpoints.load import load_dit

    _register(trained_run, store, GOOD)
    promote(NAME, 1)
    res = resolve_model_uri(f"models:/{NAME}@champion")
    assert res.version == 1 and res.root.is_relative_to(tmp_path / "cache")
    assert (res.checkpoint / "checkpoints" / "step_00000002" / "manifest.json").is_file()
    cfg = yaml.safe_load((res.checkpoint / "config.yaml").read_text())
    assert cfg["data"]["tokenizer"] == str(res.tokenizer)  # the copied tokenizer
    assert resolve_model_uri(f"models:/{NAME}/1").root == res.root  # cached: one folder
    loaded = load_dit(f"models:/{NAME}@champion")  # what evaluation loads
    assert loaded.step == 2 and loaded.checkpoint.is_relative_to(res.root)


@pytest.mark.parametrize(
    "uri, match",
    [
        (f"models:/{NAME}@nope", "has no alias @nope \\(versions \\[1\\], aliases @champion\\)"),
        (f"models:/{NAME}/7", "has no that version|has no"),
        ("models:/vfm-other@champion", "no registered model 'vfm-other'"),
        ("models:/bad uri/x/y", "expected models:/NAME@ALIAS"),
    ],
)
def test_unknown_uri_is_one_line(trained_run, store, uri, match):
    _register(trained_run, store, GOOD)
    promote(NAME, 1)
    with pytest.raises(RegistryError, match=match):
        resolve_model_uri(uri)


def test_vfm_generate_and_the_prefect_task_take_models_uris(trained_run, store, tmp_path, capsys):
    from tasks.generate import generate_video
    from vfm_core.cli import main

    _register(trained_run, store, GOOD)
    promote(NAME, 1)
    for i, uri in enumerate([f"models:/{NAME}@champion", f"models:/{NAME}/1"]):
        out = tmp_path / f"cli_{i}.mp4"
        argv = ["generate", "--checkpoint", uri, "--prompt", "a red circle moving right"]
        argv += ["--frames", "5", "--size", "32x32", "--steps", "2", "--out", str(out)]
        assert main(argv) == 0, capsys.readouterr().err
        info = probe(str(out))
        assert (info.width, info.height) == (32, 32) and len(decode_frames(str(out))) == 5
        assert "decoder tokenizer:" in capsys.readouterr().out  # decoded, not a preview
    # the generate deployment's default checkpoint (deployments/prefect.yaml), as its task runs it
    default = _deployment_checkpoint("generate")
    assert default == f"models:/{NAME}@champion"
    res = generate_video.fn(
        default,
        "a blue square moving left",
        str(tmp_path / "task.mp4"),
        frames=5,
        size="32x32",
        seed=0,
        steps=2,
    )
    assert res["step"] == 2 and probe(res["mp4"]).width == 32


def _deployment_checkpoint(name: str) -> str:
    from pathlib import Path

    from flows.generate import GenerateParams

    spec = yaml.safe_load((Path(__file__).parents[2] / "deployments/prefect.yaml").read_text())
    (dep,) = [d for d in spec["deployments"] if d["name"] == name]
    return GenerateParams(**dep["parameters"]["params"]).checkpoint  # the form accepts it


def test_register_and_promote_task(trained_run, store):
    from tasks.registry import register_and_promote

    first = register_and_promote.fn(
        str(trained_run), store, train_run_id=training_run(store), metrics=GOOD
    )
    assert first["promoted"] and first["champion_uri"] == f"models:/{NAME}@champion"
    second = register_and_promote.fn(
        str(trained_run),
        store,
        train_run_id=training_run(store),
        metrics={**GOOD, "frechet_distance": 10.4},
        rule={"tolerance": 0.05},
    )
    assert second["promoted"] and second["version"] == 2 and "tolerance 0.05" in second["reason"]
    with pytest.raises(RegistryError, match="unknown keys"):
        register_and_promote.fn(
            str(trained_run), store, train_run_id=None, metrics=GOOD, rule={"fd_max": 1}
        )


def test_a_version_outlives_its_run_and_tokenizer_folders(
    trained_run, tokenizer_dir, store, tmp_path
):
    """The registered version carries everything: with the run and the tokenizer folder gone,
    ``vfm generate`` and the pyfunc model still decode with the shipped tokenizer."""
    import shutil

    from vfm_core.cli import main

    run, tok = tmp_path / "run", tmp_path / "tok"
    shutil.copytree(trained_run, run)
    shutil.copytree(tokenizer_dir, tok)
    cfg = yaml.safe_load((run / "config.yaml").read_text())
    cfg["data"]["tokenizer"] = str(tok)
    (run / "config.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    _register(run, store, GOOD)
    promote(NAME, 1)
    shutil.rmtree(run)
    shutil.rmtree(tok)
    out = tmp_path / "gone.mp4"
    argv = ["generate", "--checkpoint", f"models:/{NAME}@champion", "--prompt", "a red disc"]
    assert main([*argv, "--frames", "5", "--size", "32x32", "--steps", "2", "--out", str(out)]) == 0
    assert decode_frames(str(out)).shape == (5, 32, 32, 3)
    model = mlflow.pyfunc.load_model(f"models:/{NAME}/1")
    assert model.predict({"prompt": "a red disc", "steps": 2})["frames"][0] == 5


@pytest.mark.parametrize(
    "rows, message",
    [
        (
            {"prompt": [None]},
            "row 0, column 'prompt': expected the text of a prompt (not empty), got None",
        ),
        (
            {"prompt": ["a", " "]},
            "row 1, column 'prompt': expected the text of a prompt (not empty), got ' '",
        ),
        (
            {"prompt": ["a", 5]},
            "row 1, column 'prompt': expected the text of a prompt (not empty), got 5",
        ),
        (
            {"prompt": ["a"], "frames": [2.5]},
            "row 0, column 'frames': expected an integer >= 1, got 2.5",
        ),
        (
            {"prompt": "a", "steps": -3},
            "row 0, column 'steps': expected an integer in [1, 1000], got -3",
        ),
        ({"prompt": "a", "seed": True}, "row 0, column 'seed': expected an integer >= 0, got True"),
        (
            {"prompt": "a", "size": "big"},
            "row 0, column 'size': expected HxW with two positive integers, e.g. 32x32, got 'big'",
        ),
        (
            [{"prompt": "a", "guidance": "high"}],
            "row 0, column 'guidance': expected a number in [0, 30], got 'high'",
        ),
        (
            {"prompt": "a", "step": 2},
            "column 'step': not an input (the inputs: prompt, frames, size, seed, steps, guidance)",
        ),
        ({"steps": [2]}, "column 'prompt': required, missing"),
        ("a red disc", "expected a table of rows with a 'prompt' column, got str"),
    ],
)
def test_predict_names_the_row_column_and_rule_of_bad_input(rows, message):
    """Checked before any model work: the input alone decides (no load_context needed); a
    request error of the scoring server (HTTP 400) with this one line."""
    from mlflow.exceptions import MlflowException
    from mlflow.protos.databricks_pb2 import INVALID_PARAMETER_VALUE, ErrorCode

    from vfm_core.infer.pyfunc import VideoModel

    with pytest.raises(MlflowException) as e:
        VideoModel().predict(None, rows)
    assert e.value.message == message
    assert e.value.error_code == ErrorCode.Name(INVALID_PARAMETER_VALUE)
    assert e.value.get_http_status_code() == 400


def test_a_models_uri_on_a_store_that_does_not_exist_creates_nothing(tmp_path, monkeypatch):
    """The default store under a fresh data dir holds no model: one line naming the store, and
    neither a database nor its folder is made by asking."""
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setenv("VFM_DATA_DIR", str(tmp_path / "data"))
    with pytest.raises(RegistryError, match=r"no registered model 'vfm-x': the tracking store "):
        resolve_model_uri("models:/vfm-x@champion")
    assert not (tmp_path / "data").exists()
