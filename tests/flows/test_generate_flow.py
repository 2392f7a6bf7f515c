"""Generation flow under a real Prefect API: a checkpoint written by the training task + prompts ->
MP4/GIF/latents and the evaluation as artifacts and metrics of one MLflow run; bad parameters are
refused by the form, a failing generation marks the run FAILED with the reason."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from flows.generate import GenerateParams, generate_flow
from tasks.generate import generate_video
from tasks.shard import encode_latents
from tasks.train import train_model
from vfm_core.config import apply_overrides
from vfm_core.errors import UserError
from vfm_core.recipes import get_recipe

TINY = [
    "model.hidden=64",
    "model.depth=2",
    "model.adaln_lora_rank=16",
    "data.batch_size=2",
    "data.latent_height=8",
    "data.latent_width=8",
    "train.steps=2",
    "tracking.mlflow=false",
    "diffusion.num_steps=3",
    "train.device=cpu",
]


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> tuple[str, str]:
    """(run dir of a 2-step `vfm train` run, a tok-tiny tokenizer dir)."""
    import torch

    from vfm_core.tokenizer import CausalVideoAutoencoder, TokenizerConfig, save_tokenizer

    root = tmp_path_factory.mktemp("gen-flow")
    cfg = apply_overrides(get_recipe("dit-tiny"), TINY)
    summary = train_model.fn(cfg, str(root / "run"))
    assert summary["step"] == 2
    torch.manual_seed(0)
    save_tokenizer(CausalVideoAutoencoder(TokenizerConfig(base_channels=16)), root / "tok")
    return str(root / "run"), str(root / "tok")


def test_params_validate():
    ok = dict(checkpoint="run", prompts=["a cat"])
    with pytest.raises(ValidationError, match="prompts \\[1\\] are empty"):
        GenerateParams(**{**ok, "prompts": ["a cat", "  "]})
    with pytest.raises(ValidationError, match="at least 1 item"):
        GenerateParams(**{**ok, "prompts": []})
    with pytest.raises(ValidationError, match="size '64': expected HxW"):
        GenerateParams(**{**ok, "size": "64"})
    with pytest.raises(ValidationError, match="less than or equal to 30"):
        GenerateParams(**{**ok, "guidance": 31})
    schema = GenerateParams.model_json_schema()  # what the Prefect UI renders as a form
    assert {"checkpoint", "prompts", "frames", "size", "nproc", "guidance"} <= set(
        schema["properties"]
    )
    # the bounds' defaults are the library's (flows never import torch to read them)
    from tasks.generate import FORM_FIELDS
    from vfm_core.infer.budget import MAX_MINUTES, MEMORY_FRACTION

    assert schema["properties"]["max_minutes"]["default"] == MAX_MINUTES
    assert f"{MEMORY_FRACTION:.0%} of free" in schema["properties"]["max_memory_gib"]["description"]
    assert set(FORM_FIELDS.values()) <= set(schema["properties"])  # every flag named has a field


def test_generate_flow_logs_videos_and_evaluation(prefect_api, trained, tmp_path):
    import mlflow

    run, tok = trained
    params = GenerateParams(
        checkpoint=run,
        prompts=["a red circle moving right", "a blue square"],
        frames=5,
        size="64x64",
        steps=2,
        guidance=2.0,
        tokenizer=tok,
        out_dir=str(tmp_path / "gen"),
        eval_samples=4,
        experiment="test-generate-flow",
    )
    out = generate_flow(params)
    assert [v["frames"] for v in out["videos"]] == [5, 5]
    assert [v["seed"] for v in out["videos"]] == [0, 1]
    client = mlflow.MlflowClient()
    r = client.get_run(out["mlflow_run_id"])
    assert r.info.status == "FINISHED" and r.data.tags["vfm.stage"] == "generate"
    assert r.info.run_name == "generate run (2 prompts)" and r.data.params["nproc"] == "1"
    arts = {a.path for a in client.list_artifacts(r.info.run_id, "videos")}
    for i in range(2):
        for ext in ("mp4", "gif", "latent.npy"):
            assert f"videos/video_{i:03d}.{ext}" in arts
    assert {"generation.json", "contact_sheet.png"} <= {
        a.path for a in client.list_artifacts(r.info.run_id)
    }
    # prompt following: only the vocabulary prompt can be read back from the pixels
    assert out["prompt_following"]["n_scored"] == 1
    assert r.data.metrics["prompt/colour_acc"] == out["prompt_following"]["colour_acc"]
    # the contact sheet: one labelled row of frames per prompt
    from PIL import Image

    sheet = Image.open(out["contact_sheet"])
    assert sheet.height > 2 * 64 * 2 and sheet.width >= 5 * 64 * 2
    # the evaluation is its own run, nested under the generation (no pipeline parent here)
    ev = client.get_run(out["eval_run_id"])
    assert ev.info.status == "FINISHED" and ev.data.tags["vfm.stage"] == "evaluate"
    assert ev.data.tags["mlflow.parentRunId"] == r.info.run_id
    assert ev.data.metrics["eval/frechet_distance"] == pytest.approx(
        out["metrics"]["frechet_distance"]
    )
    assert "eval/loss_sigma_1" in ev.data.metrics
    (fd,) = client.get_metric_history(ev.info.run_id, "eval/frechet_distance")
    assert fd.step == out["metrics"]["checkpoint_step"] == 2  # at the checkpoint's step


def test_bad_requests_fail_before_the_run_and_a_failing_one_marks_it_failed(
    prefect_api, trained, tmp_path
):
    """Every video's request is checked before the MLflow run is made (a missing checkpoint, or
    token sampling settings for a diffusion run, left a FAILED run behind); a generation that
    fails later ends its run FAILED with the error."""
    import mlflow

    from vfm_core.tracking import tracking_uri

    run, _ = trained
    form = {"prompts": ["x"], "evaluate": False, "experiment": "test-generate-flow-checks"}

    client = mlflow.MlflowClient(tracking_uri())  # the flows' store (not MLflow's cwd default)

    def runs():
        exp = client.get_experiment_by_name(form["experiment"])
        return [] if exp is None else client.search_runs([exp.experiment_id])

    missing = GenerateParams(checkpoint=str(tmp_path / "missing"), **form)
    with pytest.raises(UserError, match=r"^checkpoint .*missing: no such directory$"):
        generate_flow(missing)
    sampled = GenerateParams(checkpoint=run, top_k=5, out_dir=str(tmp_path / "g"), **form)
    with pytest.raises(UserError, match=r"^top_k: token sampling settings"):
        generate_flow(sampled)
    assert len(runs()) == 0  # no MLflow run made for either

    # a tokenizer of other latent channels: found when the decoder loads, after the checks
    from vfm_core.tokenizer import CausalVideoAutoencoder, TokenizerConfig, save_tokenizer

    tok8 = tmp_path / "tok8"
    save_tokenizer(
        CausalVideoAutoencoder(TokenizerConfig(base_channels=16, latent_channels=8)), tok8
    )
    fails = GenerateParams(checkpoint=run, tokenizer=str(tok8), out_dir=str(tmp_path / "f"), **form)
    with pytest.raises(UserError, match="8 latent channels, expected 4"):
        generate_flow(fails)
    (made,) = runs()
    assert made.info.status == "FAILED"
    assert "8 latent channels" in made.data.tags["vfm.error"]


def test_generate_task_fn_names_tokenizer_mismatch(trained, tmp_path):
    from vfm_core.tokenizer import CausalVideoAutoencoder, TokenizerConfig, save_tokenizer

    run, _ = trained
    save_tokenizer(
        CausalVideoAutoencoder(TokenizerConfig(base_channels=16, latent_channels=8)),
        tmp_path / "tok8",
    )
    with pytest.raises(UserError, match="8 latent channels, expected 4"):
        generate_video.fn(
            run,
            "a cat",
            str(tmp_path / "x.mp4"),
            frames=5,
            size="64x64",
            seed=0,
            tokenizer=str(tmp_path / "tok8"),
        )


def test_generate_task_fn_calls_the_library_in_process(trained, tmp_path, monkeypatch):
    """nproc 1: the task runs the generation library in its own process (no subprocess, no
    stdout to parse); bad input fails it with the library's one-line message."""
    import subprocess

    from vfm_core.infer.generate import read_result, result_path

    run, tok = trained

    def boom(*_a, **_k):
        raise AssertionError("the task started a process")

    monkeypatch.setattr(subprocess, "Popen", boom)
    out = tmp_path / "v.mp4"
    kw = dict(frames=5, size="64x64", seed=2, steps=1, tokenizer=tok)
    res = generate_video.fn(run, "a cat", str(out), **kw)
    assert res["ranks"] == 1 and res["seed"] == 2 and res["mp4"] == str(out)
    assert res == read_result(result_path(out)).to_dict()
    for bad, msg in (
        (dict(size="64"), r"^size '64': expected HxW"),
        (dict(nproc=0), r"^nproc: must be >= 1, got 0$"),
        (dict(guidance=31.0), r"^guidance 31.0: must be a number in \[0, 30\]"),
        # the flow's errors name the form's fields, not `vfm generate`'s flags
        (dict(max_minutes=1e-9), r"over the bound of .* \(max_minutes\)"),
    ):
        with pytest.raises(UserError, match=msg) as e:
            generate_video.fn(run, "a cat", str(tmp_path / "b.mp4"), **{**kw, **bad})
        tb = e.value.__traceback__
        while tb.tb_next is not None:
            tb = tb.tb_next
        assert tb.tb_frame.f_code.co_name == "generate_video"  # not the library's frames


def test_encode_shards_task_fn(trained, tmp_path):
    import numpy as np
    import pandas as pd

    from vfm_core.data.index import read_index
    from vfm_core.data.shards import write_shards
    from vfm_core.video.synthetic import Segment, VideoSpec, make_video

    _, tok = trained
    make_video(
        tmp_path / "c.mp4",
        VideoSpec(width=32, height=32, fps=8.0, segments=(Segment(kind="moving", n_frames=9),)),
    )
    clips = pd.DataFrame([{"clip_id": "c0", "uri": str(tmp_path / "c.mp4"), "caption": "a"}])
    write_shards(clips, str(tmp_path / "src"), embed=lambda c: np.ones((len(c), 8), np.float32))
    out = encode_latents.fn(str(tmp_path / "src"), str(tmp_path / "dst"), tokenizer=tok)
    assert out["encoded"] == 1 and out["index"].endswith("index.json")
    assert read_index(str(tmp_path / "dst")).samples.at[0, "latent_shape"] == [4, 3, 4, 4]
