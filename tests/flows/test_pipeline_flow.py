"""The end-to-end DAG on the built-in sample under a real (ephemeral) Prefect API: a failing stage
fails the flow with the stage named and keeps what came before; the rerun resumes at that stage;
the training run carries the dataset lineage in MLflow."""

from __future__ import annotations

import json

import pytest

from flows.pipeline import PipelineParams, PipelineStageError, pipeline_flow
from tasks.pipeline import stage_marker
from vfm_core.video.sample_set import SAMPLE_MAX_LEN_S, SAMPLE_MIN_LEN_S

TINY = ["data.batch_size=2"]


@pytest.mark.slow
def test_pipeline_fails_with_stage_named_then_resumes_with_lineage(prefect_api, tmp_path):
    import mlflow

    base = dict(
        name="t-pipe",
        work_dir=str(tmp_path),
        sample_videos=1,
        min_len_s=SAMPLE_MIN_LEN_S,
        max_len_s=SAMPLE_MAX_LEN_S,
        tokenizer_steps=3,
        train_steps=2,
        latent_grid=(2, 4, 4),
        experiment="t-pipeline",
        prompts=["moving shapes"],
        generate_steps=2,
        eval_prompts=3,
        eval_samples=4,
    )
    bad = PipelineParams(**base, overrides=TINY + ["model.in_channels=7"])  # != tokenizer latents
    with pytest.raises(PipelineStageError, match="pipeline stage 'train' failed"):
        pipeline_flow(bad)
    kept = {
        s: stage_marker(str(tmp_path), s)
        for s in ("sample", "curate", "shard", "tokenizer", "encode")
    }
    assert all(p.exists() for p in kept.values())
    assert not stage_marker(str(tmp_path), "train").exists()
    mtimes = {s: p.stat().st_mtime_ns for s, p in kept.items()}

    out = pipeline_flow(PipelineParams(**base, overrides=TINY))
    assert {s: p.stat().st_mtime_ns for s, p in kept.items()} == mtimes  # not rerun
    assert out["curate"]["n_clips"] > 0 and out["shard"]["n_samples"] == out["curate"]["n_clips"]
    assert out["train"]["step"] == 2
    assert out["encode"]["encoded"] == out["shard"]["n_samples"]  # trained on latents
    (video,) = out["generate"]["videos"]
    assert video["mp4"].endswith(".mp4") and (tmp_path / "generated").is_dir()
    assert out["generate"]["metrics"]["frechet_distance"] >= 0
    report = (tmp_path / "report.md").read_text()
    assert "| train | dit-tiny 2 steps" in report and "| generate | 1 videos" in report
    # prompt following: 3 vocabulary prompts generated, read back, shown on a contact sheet
    m = out["generate"]["metrics"]
    assert m["prompt_n_scored"] == 3 and 0 <= m["prompt_colour_acc"] <= 1
    assert 0 <= m["untrained_prompt_direction_acc"] <= 1
    assert "| prompt following | 3 vocabulary prompts" in report
    assert out["generate"]["prompt_sheet"] in report

    run = mlflow.MlflowClient().get_run(out["train"]["mlflow_run_id"])
    assert run.data.tags["vfm.clips_manifest"] == out["curate"]["clips"]
    assert run.data.tags["vfm.shards_index"] == out["shard"]["index"]
    names = {d.dataset.name for d in run.inputs.dataset_inputs}
    assert names == {"clips", "shards"}

    # MLflow: one parent run per pipeline, a child run per stage, linked to the Prefect flow run
    client = mlflow.MlflowClient()
    parent = client.get_run(out["mlflow_run_id"])
    assert parent.info.run_name == "pipeline t-pipe" and parent.info.status == "FINISHED"
    children = client.search_runs(
        [parent.info.experiment_id], f"tags.`mlflow.parentRunId` = '{parent.info.run_id}'"
    )
    stages = {c.data.tags["vfm.stage"]: c for c in children}
    assert set(stages) == {"train", "generate", "evaluate"}
    assert stages["train"].info.run_name == "dit-tiny 1proc 2 steps"
    assert stages["train"].info.run_id == out["train"]["mlflow_run_id"]
    for r in (parent, *children):
        assert r.data.tags["vfm.prefect_flow_run_id"]  # the flow run that made it
        assert len(r.data.tags["mlflow.source.git.commit"]) == 40
    assert stages["train"].data.tags["vfm.checkpoint"].startswith("file://")
    assert parent.data.tags["vfm.checkpoint"] == stages["train"].data.tags["vfm.checkpoint"]
    arts = {a.path for a in client.list_artifacts(parent.info.run_id)}
    assert {"report.md", "contact_sheet.png", "prompt_following.png"} <= arts
    assert 0 <= parent.data.metrics["prompt_direction_acc"] <= 1  # headline metrics
    assert parent.data.metrics["tokenizer_psnr"] > 0
    assert {"config.yaml", "metrics.jsonl"} <= {
        a.path for a in client.list_artifacts(out["train"]["mlflow_run_id"])
    }
    # the failed first attempt: its parent ended FAILED with the stage's error
    failed = client.search_runs([parent.info.experiment_id], "attributes.status = 'FAILED'")
    assert any(
        "pipeline stage 'train' failed" in r.data.tags.get("vfm.error", "")
        for r in failed
        if r.data.tags.get("vfm.stage") == "pipeline"
    )

    again = pipeline_flow(PipelineParams(**base, overrides=TINY))  # everything done: no work
    assert again["train"]["mlflow_run_id"] == out["train"]["mlflow_run_id"]
    # the new pipeline run has no children: its report and tag say where the reused runs are
    assert again["reused"] == [
        "sample",
        "curate",
        "shard",
        "tokenizer",
        "encode",
        "train",
        "generate",
    ]
    runs_line = again["report"].splitlines()[-1]
    assert "nested under it" not in runs_line
    assert (
        f"reused from an earlier run of this pipeline, not nested here: train run "
        f"`{out['train']['mlflow_run_id']}`, generate run "
        f"`{out['generate']['mlflow_run_id']}`"
    ) in runs_line
    assert "nested under it" in out["report"].splitlines()[-1]
    tags = client.get_run(again["mlflow_run_id"]).data.tags
    assert tags["vfm.reused_stages"] == ",".join(again["reused"])
    marker = json.loads(stage_marker(str(tmp_path), "train").read_text())
    assert marker["outputs"] == [out["train"]["checkpoint"]]


def test_pipeline_form_rejects_bad_values():
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="train_steps"):
        PipelineParams(train_steps=0)
    with pytest.raises(ValidationError, match="name"):
        PipelineParams(name="../escape")
    # the family picks the default recipe; a recipe of the other family is one clear error
    assert PipelineParams(family="autoregressive").recipe == "ar-tiny"
    assert PipelineParams().recipe == "dit-tiny"
    with pytest.raises(ValidationError, match="recipe 'dit-tiny' is a diffusion model, but family"):
        PipelineParams(family="autoregressive", recipe="dit-tiny")


@pytest.mark.slow
def test_pipeline_autoregressive_family(prefect_api, tmp_path):
    """family=autoregressive: a discrete (FSQ) tokenizer, token shards, ar-tiny trained on them,
    a generated video decoded from sampled tokens, held-out bits per token in the report."""
    import mlflow
    import numpy as np

    params = PipelineParams(
        name="t-ar",
        family="autoregressive",
        work_dir=str(tmp_path),
        sample_videos=1,
        min_len_s=SAMPLE_MIN_LEN_S,
        max_len_s=SAMPLE_MAX_LEN_S,
        tokenizer_steps=3,
        train_steps=3,
        latent_grid=(2, 4, 4),
        experiment="t-pipeline-ar",
        overrides=["data.batch_size=2", "model.depth=2"],
        prompts=["a red circle moving right"],
    )
    out = pipeline_flow(params)
    assert out["tokenizer"]["preset"] == "tok-tiny-discrete"
    assert out["train"]["step"] == 3
    (video,) = out["generate"]["videos"]
    tokens = np.load(video["tokens"], allow_pickle=False)
    assert tokens.shape == (2, 4, 4) and 0 <= tokens.min() and tokens.max() < 1000
    m = out["generate"]["metrics"]
    assert 0 < m["heldout_bits_per_token"] and m["uniform_bits_per_token"] == pytest.approx(
        np.log2(1000)
    )
    report = (tmp_path / "report.md").read_text()
    assert "| train | ar-tiny 3 steps" in report and "bits/token" in report
    assert "of the codebook used" in report and 0 < out["tokenizer"]["codebook_usage"] <= 1
    run = mlflow.MlflowClient().get_run(out["train"]["mlflow_run_id"])
    assert run.info.run_name == "ar-tiny 1proc 3 steps" and run.data.metrics["loss"] > 0
