"""The end-to-end DAG on the built-in sample under a real (ephemeral) Prefect API: a failing stage
fails the flow with the stage named and keeps what came before; the rerun resumes at that stage
(Prefect's cache: the finished stages' task runs are ``Cached``); a changed input reruns only the
stages that depend on it, a deleted output its stage; the training run carries the dataset lineage
in MLflow."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest
import yaml
from prefect import flow, task

from flows.pipeline import PipelineParams, PipelineStageError, StageRunner, pipeline_flow
from tasks.pipeline import STAGE_RESULTS, stage_cache
from vfm_core.storage import fingerprint
from vfm_core.video.sample_set import SAMPLE_MAX_LEN_S, SAMPLE_MIN_LEN_S

TINY = ["data.batch_size=2"]

STAGE_TASKS = {
    "sample": "sample-videos",
    "curate": "curate-stage",
    "shard": "shard-stage",
    "tokenizer": "train-tokenizer",
    "encode": "encode-latents",
    "train": "train-stage",
    "generate": "generate-stage",
}
"""Pipeline stage -> the name of its task."""


def small(tmp_path: Path, **changes) -> PipelineParams:
    """The pipeline on one sample video, a few steps each, one generated video."""
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
        overrides=TINY,
    )
    return PipelineParams(**{**base, **changes})


def stage_states(state, ran=tuple(STAGE_TASKS)) -> dict[str, str]:
    """{stage: state name of its task run} for every stage with a task run in the flow run that
    ended in ``state``, read through the Prefect client (task run states reach the API as events:
    wait until each stage of ``ran``, the stages the flow got to, has a final one; a stage that
    never runs would only be waited for until the deadline)."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    flow_run = FlowRunFilter(id=FlowRunFilterId(any_=[state.state_details.flow_run_id]))
    deadline = time.monotonic() + 60
    while True:
        with get_client(sync_client=True) as client:
            runs = client.read_task_runs(flow_run_filter=flow_run)
        by_task = {r.name.rsplit("-", 1)[0]: r.state for r in runs if r.state is not None}
        got = {s: by_task[t] for s, t in STAGE_TASKS.items() if t in by_task}
        if (set(ran) <= set(got) and all(st.is_final() for st in got.values())) or (
            time.monotonic() > deadline
        ):
            return {s: st.name for s, st in got.items()}
        time.sleep(0.5)


@pytest.mark.slow
def test_pipeline_fails_with_stage_named_resumes_with_lineage_then_reruns_only_what_changed(
    prefect_api, tmp_path
):
    import mlflow

    bad = small(tmp_path, overrides=TINY + ["model.in_channels=7"])  # != tokenizer latents
    crashed = pipeline_flow(bad, return_state=True)
    with pytest.raises(PipelineStageError, match="pipeline stage 'train' failed"):
        crashed.result()
    kept = ("sample", "curate", "shard", "tokenizer", "encode")
    # every stage up to train, and no other (generate never ran)
    assert stage_states(crashed, ran=(*kept, "train")) == {
        **dict.fromkeys(kept, "Completed"),
        "train": "Failed",
    }

    resumed = pipeline_flow(small(tmp_path), return_state=True)
    out = resumed.result()
    assert stage_states(resumed) == {
        **dict.fromkeys(kept, "Cached"),  # not rerun
        "train": "Completed",
        "generate": "Completed",
    }
    assert out["reused"] == list(kept)
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
    assert "x lower than untrained" in report and "two halves of the data" in report
    assert out["generate"]["prompt_sheet"] in report

    run = mlflow.MlflowClient().get_run(out["train"]["mlflow_run_id"])
    assert run.data.tags["vfm.clips_manifest"] == out["curate"]["clips"]
    assert run.data.tags["vfm.shards_index"] == out["shard"]["index"]
    names = {d.dataset.name for d in run.inputs.dataset_inputs}
    assert names == {"clips", "shards"}
    # model.text_len sized from the data: the longest caption in tokens, so none was cut
    from vfm_core.data.index import read_index

    longest = read_index(str(tmp_path / "shards")).meta["caption_tokens"]["max"]
    saved = mlflow.artifacts.download_artifacts(run_id=run.info.run_id, artifact_path="config.yaml")
    cfg = yaml.safe_load(Path(saved).read_text())
    assert cfg["model"]["text_len"] == longest and run.data.metrics["captions_cut"] == 0

    # MLflow: one parent run per pipeline, a child run per stage, linked to the Prefect flow run
    client = mlflow.MlflowClient()
    parent = client.get_run(out["mlflow_run_id"])
    assert parent.info.run_name == "pipeline t-pipe" and parent.info.status == "FINISHED"
    children = client.search_runs(
        [parent.info.experiment_id], f"tags.`mlflow.parentRunId` = '{parent.info.run_id}'"
    )
    stages = {c.data.tags["vfm.stage"]: c for c in children}
    assert set(stages) == {"train", "generate", "evaluate"}
    # the registered version's model holds the evaluation as metrics: the evaluate run's own
    # records, linked (one point each in that run), not logged again
    evaluate, reg = stages["evaluate"].info.run_id, out["registry"]
    linked = {m.key: (m.value, m.run_id) for m in client.get_logged_model(reg["model_id"]).metrics}
    assert linked["eval/frechet_distance"] == (m["frechet_distance"], evaluate)
    assert len(client.get_metric_history(evaluate, "eval/frechet_distance")) == 1
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

    again_state = pipeline_flow(small(tmp_path), return_state=True)  # everything done: no work
    assert stage_states(again_state) == dict.fromkeys(STAGE_TASKS, "Cached")
    again = again_state.result()
    assert again["train"]["mlflow_run_id"] == out["train"]["mlflow_run_id"]
    assert again["train"]["checkpoint"] == out["train"]["checkpoint"]  # read back
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
    # the stages' results are Prefect result records in JSON (no pickle), under WORK/stages/
    records = [json.loads(f.read_text()) for f in (tmp_path / "stages").iterdir()]
    results = [json.loads(r["result"]) for r in records if isinstance(r, dict) and "metadata" in r]
    assert out["train"]["checkpoint"] in [
        r.get("checkpoint") for r in results if isinstance(r, dict)
    ]

    # a changed training setting reruns train and generate only; a deleted output folder reruns
    # its stage, and the stages after it only if its content changed
    changed = pipeline_flow(small(tmp_path, train_steps=3), return_state=True)
    upstream = ("sample", "curate", "shard", "tokenizer", "encode")
    assert stage_states(changed) == {
        **dict.fromkeys(upstream, "Cached"),
        "train": "Completed",
        "generate": "Completed",
    }
    assert changed.result()["train"]["step"] == 3

    index = (tmp_path / "latents" / "index.json").read_bytes()
    shutil.rmtree(tmp_path / "latents")
    deleted = pipeline_flow(small(tmp_path, train_steps=3), return_state=True)
    states = stage_states(deleted)
    assert states["encode"] == "Completed"
    assert {states[s] for s in ("sample", "curate", "shard", "tokenizer")} == {"Cached"}
    # the same shards and tokenizer give the same latents: their index (the fingerprint the
    # training stage is keyed on) is unchanged, so training and generation stay cached
    assert (tmp_path / "latents" / "index.json").read_bytes() == index
    assert states["train"] == states["generate"] == "Cached"

    # the fine-tuning demo (`make finetune`) on this pipeline's model, tokenizer and latents
    from flows.finetune import finetune_flow

    grid, work = (2, 4, 4), tmp_path / "finetune"
    ft = finetune_flow(
        demo=str(tmp_path),
        videos=1,
        steps=2,
        eval_samples=4,
        eval_prompts=2,
        eval_steps=2,
        latent_grid=grid,
        overrides=tuple(TINY),
        work_dir=str(work),
    )
    rows = ft["rows"]
    assert list(rows) == ["demo model (before)", "LoRA rank 16", "full fine-tuning", "from scratch"]
    lora, full = rows["LoRA rank 16"]["trainable"], rows["full fine-tuning"]["trainable"]
    assert 0 < lora < full / 10 and full == rows["from scratch"]["trainable"]
    assert all(
        {"concept_colour_acc", "prompt_colour_acc", "frechet_distance"} <= set(r)
        for r in rows.values()
    )
    assert (work / "report.md").read_text() == ft["report"] and "magenta" in ft["report"]
    (raw,) = (work / "raw").glob("*.json")
    assert {s["caption"].split()[1] for s in json.loads(raw.read_text())["segments"]} == {"magenta"}


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


def test_fingerprint_of_folders_and_indexed_shards(tmp_path):
    assert fingerprint(str(tmp_path / "nothing")) == "missing"
    (tmp_path / "clips").mkdir()
    (tmp_path / "clips" / "a.mp4").write_bytes(b"12")
    before = fingerprint(str(tmp_path / "clips"))
    (tmp_path / "clips" / "a.mp4").write_bytes(b"123")  # size (and mtime) changed
    assert fingerprint(str(tmp_path / "clips")) != before
    shards = tmp_path / "shards"
    shards.mkdir()
    (shards / "index.json").write_text('{"shards": []}')
    (shards / "shard-0.tar").write_bytes(b"x")
    indexed = fingerprint(str(shards))
    (shards / "index.json").write_text('{"shards": []}')  # rewritten, same content
    assert fingerprint(str(shards)) == indexed
    (shards / "index.json").write_text('{"shards": [1]}')
    assert fingerprint(str(shards)) != indexed


@task(name="toy-copy", cache_policy=stage_cache("src"), **STAGE_RESULTS)
def _toy_copy(src: str, dst: str) -> dict:
    shutil.copytree(src, dst, dirs_exist_ok=True)
    return {"n": len(list(Path(dst).iterdir()))}


@task(name="toy-count", cache_policy=stage_cache("src", exclude=("run_id",)), **STAGE_RESULTS)
def _toy_count(src: str, dst: str, run_id: str) -> dict:
    Path(dst).mkdir(exist_ok=True)
    return {"bytes": sum(f.stat().st_size for f in Path(src).iterdir())}


@flow(name="toy-stages")
def _toy_pipeline(src: str, work: str) -> list[str]:
    stages = StageRunner(work)
    stages.run("copy", _toy_copy, f"{work}/copy", src=src, dst=f"{work}/copy")
    stages.run(
        "count", _toy_count, f"{work}/count", src=f"{work}/copy", dst=f"{work}/count", run_id=work
    )
    return stages.reused


def test_stages_come_from_the_cache_until_an_input_or_an_output_changes(prefect_api, tmp_path):
    src, work = tmp_path / "src", str(tmp_path / "work")
    src.mkdir()
    (src / "a").write_bytes(b"1")
    assert _toy_pipeline(str(src), work) == []
    assert _toy_pipeline(str(src), work) == ["copy", "count"]  # same inputs: Cached
    shutil.rmtree(f"{work}/count")
    assert _toy_pipeline(str(src), work) == ["copy"]  # its output gone: the stage reruns
    assert Path(work, "count").is_dir()
    assert _toy_pipeline(str(src), work) == ["copy", "count"]  # and its cache entry is fresh
    (src / "b").write_bytes(b"22")
    assert _toy_pipeline(str(src), work) == []  # new input: copy reruns, so does count
    with pytest.raises(PipelineStageError, match="pipeline stage 'copy' failed"):
        _toy_pipeline(str(tmp_path / "missing"), work)
