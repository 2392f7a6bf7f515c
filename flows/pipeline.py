"""The whole pipeline as one Prefect DAG: sample → curate → shard → tokenizer → encode latents →
train → generate → report. Each stage is a flow (or task) usable alone; this flow only composes
them, each through a stage task cached by Prefect.

Resumable through Prefect's own caching (:func:`tasks.pipeline.stage_cache`): a stage's cache key
covers its inputs (the parameters and typed configs it is given) and the contents of what it reads
(the sha256 of the shards' and latents' ``index.json``; the listing with sizes and mtimes of the
source videos, clips, tokenizer and checkpoint folders); its summary is persisted as JSON under
``WORK/stages/``. A rerun with the same key answers from the cache (task state ``Cached``: the
stage is skipped and listed in ``reused``), so a crash in ``train`` keeps the clips, shards and
tokenizer and the rerun starts at ``train``; a changed input reruns the stages that read it,
directly or through an upstream output whose content changed; a stage whose output is gone runs
again and refreshes its cache entry. A failing stage fails the flow with the stage named.
Hand-overs are URIs checked against the pandera contracts by the stage tasks (clips.parquet →
shard index → checkpoint). The training run in MLflow carries the dataset lineage (clips manifest
and shard index as MLflow dataset inputs). Never imports torch.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

from prefect import Task, flow, task
from pydantic import Field, field_validator, model_validator

from flows.curate import CurateParams, curate_flow
from flows.forms import NAME_PATTERN, Form, folder_name, form_config, refuse_owned
from flows.generate import GenerateParams, described, generate_flow
from flows.shard import ShardParams, shard_flow
from flows.train import (
    Family,
    TrainParams,
    family_field,
    known_recipe,
    recipe_field,
    settle_family,
    train_flow,
)
from tasks.pipeline import (
    STAGE_RESULTS,
    caption_tokens,
    encode_stage,
    lineage_task,
    sample_videos_task,
    stage_cache,
    tokenizer_geometry,
    tokenizer_task,
)
from tasks.registry import register_and_promote
from tasks.report import pipeline_report_task
from tasks.tracking import end_mlflow_run, log_to_run, start_mlflow_run
from vfm_core import storage
from vfm_core.config import FAMILY_TRAITS, ConfigError, TrackingConfig
from vfm_core.curate.config import CurateConfig
from vfm_core.output_lock import LOCK_FILE, output_lock
from vfm_core.pipeline_report import headline_metrics
from vfm_core.tracking import CHECKPOINT_TAG, STAGE_TAG, data_dir, tracking_uri
from vfm_core.video.choices import SplitterName


class PipelineStageError(RuntimeError):
    """A stage failed; earlier stages' outputs are kept and a rerun resumes at this stage."""


PIPELINE_KEYS = {
    "train.steps": "train_steps",
    "train.out_dir": "work_dir (WORK/train)",
    "tracking.experiment": "experiment",
    "data.latent_frames": "latent_grid",
    "data.latent_height": "latent_grid",
    "data.latent_width": "latent_grid",
    "data.source": "src (the pipeline trains on its own latents)",
    "data.shards": "src (the pipeline trains on its own latents)",
    "data.blend": "src (the pipeline trains on its own latents)",
    "data.tokenizer": "tokenizer",
}
"""Training config keys the pipeline sets from its own fields and stages."""


class PipelineParams(Form):
    """Form of the end-to-end pipeline."""

    name: str = Field("demo", min_length=1, pattern=NAME_PATTERN, description="run name")
    src: str = Field("", description="raw videos: folder or s3:// prefix ('' = built-in sample)")
    sample_videos: int = Field(3, ge=1, le=256, description="built-in sample size (src = '')")
    work_dir: str = Field("", description="outputs ('' = data/pipeline/NAME)")
    splitter: SplitterName = Field(CurateConfig().splitter, description="shots (curation default)")
    min_len_s: float = Field(
        CurateConfig().min_len_s,
        ge=0,
        description="shortest clip, seconds (curation default; the demo passes the built-in "
        "sample's: vfm_core.video.sample_set.SAMPLE_MIN_LEN_S)",
    )
    max_len_s: float | None = Field(
        CurateConfig().max_len_s, gt=0, description="longest clip, seconds (None: no limit)"
    )
    tokenizer: str = Field("", description="tokenizer dir ('' = train tok-tiny on the shards)")
    tokenizer_steps: int = Field(150, ge=1, description="tokenizer training steps")
    family: Family = family_field()
    recipe: str = recipe_field()
    train_steps: int = Field(200, ge=1, description="DiT training steps")
    latent_grid: tuple[int, int, int] = Field((5, 8, 8), description="latent (T, H, W) trained on")
    overrides: list[str] = Field(default_factory=list, description="extra section.field=value")
    prompts: list[str] = Field(
        default_factory=lambda: [
            "a red circle moving right",  # trained combination
            "a blue square moving up",
        ],  # held out of the sample
        description="one generated video per prompt ([] = no generation)",
    )
    generate_steps: int = Field(
        24, ge=1, le=1000, description="sampler steps per video (diffusion family)"
    )
    top_k: int = Field(
        0,
        ge=0,
        description="autoregressive: videos and evaluation draw from the k likeliest tokens",
    )
    eval_prompts: int = Field(
        40,
        ge=0,
        le=40,
        description="vocabulary prompts generated and read "
        "back in the evaluation (prompt following)",
    )
    eval_samples: int = Field(
        48,
        ge=2,
        le=1024,
        description="held-out latents for the loss and "
        "generated / reference clips for the Fréchet distance",
    )
    experiment: str = Field("vfm-pipeline", description="MLflow experiment")

    _known_recipe = field_validator("recipe")(known_recipe)
    _name = field_validator("name")(folder_name)
    _prompts = field_validator("prompts")(described)
    _family = model_validator(mode="after")(settle_family)

    @model_validator(mode="after")
    def _stages_accept(self) -> PipelineParams:
        """What a later stage would refuse, refused by the form (before any stage runs)."""
        CurateConfig(splitter=self.splitter, min_len_s=self.min_len_s, max_len_s=self.max_len_s)
        if self.top_k and not self.discrete:  # the generation would refuse it
            raise ValueError(
                f"top_k={self.top_k}: the k likeliest tokens of autoregressive runs; the "
                f"{self.family} family samples by denoising (leave top_k 0)"
            )
        refuse_owned(self.overrides, PIPELINE_KEYS)
        for name, instead in (("sample_videos", "src"), ("tokenizer_steps", "tokenizer")):
            if getattr(self, instead) and name in self.model_fields_set:  # would be ignored
                raise ValueError(f"{name}: not used when {instead} is given; leave it out")
        t, h, w = self.latent_grid
        own = {"data.source": "shards", "data.shards": "latents", "data.tokenizer": "tokenizer"}
        grid = {"data.latent_frames": t, "data.latent_height": h, "data.latent_width": w}
        try:  # the training config but for the tokenizer's geometry (known once it is trained)
            form_config(self.recipe, own, grid, {"train.steps": self.train_steps}, self.overrides)
        except ConfigError as e:
            raise ValueError(f"latent_grid / overrides: {e}") from None
        return self

    @property
    def discrete(self) -> bool:
        """Whether the family trains on discrete token ids
        (:data:`vfm_core.config.FAMILY_TRAITS`)."""
        return FAMILY_TRAITS[self.family].discrete

    def tokenizer_preset(self) -> str:
        """The tokenizer trained when none is given: continuous, or discrete for the AR family."""
        return "tok-tiny-discrete" if self.discrete else "tok-tiny"

    def work(self) -> str:
        return self.work_dir or str(data_dir() / "pipeline" / self.name)


@flow(name="pipeline", log_prints=True)
def pipeline_flow(params: PipelineParams | None = None) -> dict[str, Any]:
    p = params or PipelineParams()
    work = p.work()
    if Path(work).exists() and not Path(work).is_dir():
        raise ValueError(f"work_dir {work}: is a file; name a folder for the pipeline's outputs")
    Path(work).mkdir(parents=True, exist_ok=True)
    tracking = TrackingConfig(experiment=p.experiment)
    tags = {STAGE_TAG: "pipeline", "vfm.pipeline": p.name, "vfm.work_dir": work}
    parent = start_mlflow_run(tracking, tags, name=f"pipeline {p.name}")
    try:
        out = _run_stages(p, work, parent)
    except BaseException as e:  # the parent run ends FAILED with the stage's error
        end_mlflow_run(tracking, parent, error=str(e))
        raise
    out["mlflow_run_id"] = parent
    gen = out.get("generate", {})
    files = [f"{work}/report.md"] + [
        gen[k] for k in ("contact_sheet", "prompt_sheet") if gen.get(k)
    ]
    tags = {
        "vfm.train_run_id": out["train"].get("mlflow_run_id") or "",
        "vfm.reused_stages": ",".join(out["reused"]),
        CHECKPOINT_TAG: Path(out["train"]["checkpoint"]).resolve().as_uri(),
    }
    log_to_run(
        tracking, parent, files, tags=tags, params=p.model_dump(), metrics=headline_metrics(out)
    )
    end_mlflow_run(tracking, parent)
    return out


def train_settings(
    p: PipelineParams,
    *,
    latents: str,
    tokenizer: str,
    geometry: dict[str, int],
    caption_tokens: int | None = None,
) -> dict[str, Any]:
    """The training form's config values (typed, by dotted key) for the pipeline's own data:
    the encoded shards, the tokenizer, the latent grid, a checkpoint every 100 steps, and what
    the model takes from the tokenizer and the data, derived as ``vfm train`` derives it
    (:func:`vfm_core.tokenizer.run_settings.model_settings`: the latent channels or token ids,
    unit-variance latents, ``model.text_len`` sized to the longest caption); ``p.overrides``
    still win over them."""
    from vfm_core.tokenizer.run_settings import model_settings

    t, h, w = p.latent_grid
    return {
        "data.source": "shards",
        "data.shards": latents,
        "data.tokenizer": tokenizer,
        "data.latent_frames": t,
        "data.latent_height": h,
        "data.latent_width": w,
        **model_settings(
            discrete=p.discrete,
            geometry=geometry,
            caption_tokens=caption_tokens,
            normalized=True,  # encode-shards writes unit-variance latents
        ),
        "train.ckpt_every": 100,
    }


def pixel_shape(latent_grid: tuple[int, int, int], geometry: dict[str, int]) -> tuple[int, str]:
    """(frames, "HxW") of videos whose latent is ``latent_grid`` (T, H, W) under the tokenizer's
    ``geometry`` (:func:`tasks.pipeline.tokenizer_geometry`): 1 + t·(T - 1) frames of s·H x s·W."""
    t, h, w = latent_grid
    t_c, s = geometry["temporal_factor"], geometry["spatial_factor"]
    return 1 + t_c * (t - 1), f"{s * h}x{s * w}"


@task(name="curate-stage", cache_policy=stage_cache("params.src"), **STAGE_RESULTS)
def curate_stage(params: CurateParams) -> dict[str, Any]:
    """The curate flow, cached on its parameters and the source videos' listing."""
    return curate_flow(params)


@task(name="shard-stage", cache_policy=stage_cache("params.clips_dir"), **STAGE_RESULTS)
def shard_stage(params: ShardParams) -> dict[str, Any]:
    """The shard flow, cached on its parameters and the clips' listing."""
    return shard_flow(params)


@task(
    name="train-stage",
    cache_policy=stage_cache("latents", "tokenizer", exclude=("parent_run_id",)),
    **STAGE_RESULTS,
)
def train_stage(
    params: TrainParams,
    *,
    latents: str,
    tokenizer: str,
    clips: str,
    shards: str,
    parent_run_id: str,
) -> dict[str, Any]:
    """The train flow (its MLflow run nested under the pipeline's ``parent_run_id``, which is not
    part of the cache key) and the run's dataset lineage; cached on the training form and the
    contents of the latents and the tokenizer it trains on. It runs only when no finished run
    matches, so a checkpoint folder already there is stale: it trains from scratch."""
    params.to_config()  # a bad form fails here, before an earlier run is removed
    out = Path(params.out_dir)
    with output_lock(out, what="out_dir"):  # never the folder of a run another process writes
        remove_earlier_run(out)
    summary = train_flow(params, parent_run_id=parent_run_id)
    if summary.get("mlflow_run_id"):
        lineage_task(
            summary["mlflow_run_id"],
            params.experiment,
            clips=clips,
            shards=shards,
            tokenizer=tokenizer,
        )
        summary = {**summary, "tracking_uri": tracking_uri()}  # where a later reuse finds it
    return summary


RUN_MARKS = ("checkpoints", "metrics.jsonl", "summary.json", "config.yaml", "run.yaml")
"""What a training run's folder holds (any one marks it as a run's)."""


def remove_earlier_run(out: Path) -> None:
    """The train stage runs only when no finished run matches its inputs, so a run folder
    already at ``out`` is an earlier run's (other inputs, or crashed): removed, to start over.
    A file there, or a folder that is not a training run's, is an error naming it: nothing but
    a run is removed."""
    if not out.exists():
        return
    if not out.is_dir():
        raise ValueError(f"{out} is a file, not the training run's folder: move it away")
    found = sorted(p.name for p in out.iterdir() if p.name != LOCK_FILE)  # the lock: the caller's
    if not found:
        return
    if not any((out / mark).exists() for mark in RUN_MARKS):
        shown = ", ".join(found[:5]) + (", ..." if len(found) > 5 else "")
        raise ValueError(
            f"{out} holds files that are not a training run's ({shown}); the train stage "
            "would replace them: move them away or choose another work_dir"
        )
    print(f"stage train: {out} holds an earlier run (other inputs, or stopped), starting over")
    for name in found:
        path = out / name
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink()
    with contextlib.suppress(OSError):  # empty unless the caller holds its writer lock
        out.rmdir()


@task(
    name="generate-stage",
    cache_policy=stage_cache("params.checkpoint", "params.tokenizer", exclude=("parent_run_id",)),
    **STAGE_RESULTS,
)
def generate_stage(params: GenerateParams, parent_run_id: str) -> dict[str, Any]:
    """The generate flow (runs nested under ``parent_run_id``), cached on its form and the
    contents of the checkpoint folder and the tokenizer."""
    summary = generate_flow(params, parent_run_id=parent_run_id)
    return {**summary, "tracking_uri": tracking_uri()}  # where a later reuse finds its run


class StageRunner:
    """Runs the pipeline's stage tasks through Prefect's cache (module docstring) with their
    results under ``WORK/stages/``; ``reused`` names the stages answered from the cache."""

    def __init__(self, work: str) -> None:
        self.work = work
        self.reused: list[str] = []
        self.times: dict[str, dict[str, Any]] = {}
        """stage -> {seconds, load_at_start (1-minute load average), cached}, in stage order."""

    def run(self, name: str, stage: Task[..., Any], output: str, **inputs: Any) -> Any:
        """Run ``stage`` on ``inputs``: from the cache when it ran before with the same key and
        its ``output`` still exists; otherwise (output gone: the cache entry is refreshed) it runs.
        A failure raises :class:`PipelineStageError` naming the stage."""
        refresh = None if storage.exists(output) else True  # None: Prefect's setting decides
        stage = stage.with_options(result_storage=Path(self.work, "stages"), refresh_cache=refresh)
        load, t0 = os.getloadavg()[0], time.perf_counter()
        state = stage(**inputs, return_state=True)
        seconds = time.perf_counter() - t0
        cached = state.name == "Cached"
        self.times[name] = {"seconds": round(seconds, 2), "load_at_start": load, "cached": cached}
        if not cached and state.is_completed():
            print(f"stage {name}: done in {seconds:.0f} s")
        try:
            result = state.result()
        except Exception as e:
            raise PipelineStageError(
                f"pipeline stage '{name}' failed: {type(e).__name__}: {e} (outputs of the earlier "
                f"stages are kept under {self.work}; rerun to resume at '{name}')"
            ) from e
        if cached:
            print(f"stage {name}: done in an earlier run, skipped")
            self.reused.append(name)
        return result


def _run_stages(p: PipelineParams, work: str, parent: str) -> dict[str, Any]:
    stages = StageRunner(work)
    out: dict[str, Any] = {"work_dir": work, "reused": stages.reused}
    src = p.src or f"{work}/raw"
    if not p.src:
        stages.run("sample", sample_videos_task, src, dst=src, n=p.sample_videos)
    curate = CurateParams(
        src=src,
        dst=f"{work}/curated",
        splitter=p.splitter,
        min_len_s=p.min_len_s,
        max_len_s=p.max_len_s,
    )
    out["curate"] = stages.run("curate", curate_stage, curate.dst, params=curate)
    shards = f"{work}/shards"
    shard = ShardParams(clips_dir=curate.dst, shards_dir=shards)
    out["shard"] = stages.run("shard", shard_stage, f"{shards}/index.json", params=shard)

    tok_dir = p.tokenizer
    if not tok_dir:
        # the tokenizer is fully convolutional and causal: it trains on small crops (5 frames of
        # 32 x 32) and encodes clips of any 1 + 4k frames and multiple-of-8 size
        tok_dir = f"{work}/tokenizer"
        out["tokenizer"] = stages.run(
            "tokenizer",
            tokenizer_task,
            tok_dir,
            shards=shards,
            out_dir=tok_dir,
            preset=p.tokenizer_preset(),
            steps=p.tokenizer_steps,
            frames=5,
            size=32,
        )

    latents = f"{work}/latents"
    enc = stages.run(
        "encode", encode_stage, f"{latents}/index.json", src=shards, dst=latents, tokenizer=tok_dir
    )
    out["encode"] = {**enc, "dir": latents}

    geometry = tokenizer_geometry(tok_dir)  # the tokenizer's own saved config
    train = TrainParams(
        family=p.family,
        recipe=p.recipe,
        steps=p.train_steps,
        out_dir=f"{work}/train",
        experiment=p.experiment,
        settings=train_settings(
            p,
            latents=latents,
            tokenizer=tok_dir,
            geometry=geometry,
            caption_tokens=caption_tokens(latents),
        ),
        overrides=p.overrides,
    )
    out["train"] = stages.run(
        "train",
        train_stage,
        train.out_dir,
        params=train,
        latents=latents,
        tokenizer=tok_dir,
        clips=out["curate"]["clips"],
        shards=out["shard"]["index"],
        parent_run_id=parent,
    )

    if p.prompts:
        frames, size = pixel_shape(p.latent_grid, geometry)
        generate = GenerateParams(
            checkpoint=train.out_dir,
            prompts=p.prompts,
            frames=frames,
            size=size,
            steps=None if p.discrete else p.generate_steps,  # discrete: one step per token
            tokenizer=tok_dir,
            out_dir=f"{work}/generated",
            experiment=p.experiment,
            eval_samples=p.eval_samples,
            eval_prompts=p.eval_prompts,
            top_k=p.top_k,
        )
        out["generate"] = stages.run(
            "generate", generate_stage, generate.out_dir, params=generate, parent_run_id=parent
        )
        gen = out["generate"]
        if gen.get("metrics"):  # evaluated: a model version of vfm-RECIPE, maybe the champion
            out["registry"] = register_and_promote(
                train.out_dir,
                TrackingConfig(experiment=p.experiment),
                train_run_id=out["train"].get("mlflow_run_id"),
                metrics=gen["metrics"],
                eval_run_id=gen.get("eval_run_id"),
                tokenizer=tok_dir,
            )
            reg = out["registry"]
            print(
                f"registered {reg['model_uri']}: "
                f"{'champion' if reg['promoted'] else 'not promoted'} ({reg['reason']})"
            )

    t0 = time.perf_counter()
    out["stage_times"] = stages.times
    out["report"] = pipeline_report_task(
        out, name=p.name, recipe=p.recipe, experiment=p.experiment, parent_run_id=parent
    )
    stages.times["report"] = {"seconds": round(time.perf_counter() - t0, 2), "cached": False}
    times = json.dumps(stages.times, indent=1).encode()
    storage.write_bytes(storage.join(work, "stage_times.json"), times)
    print(out["report"])
    return out


if __name__ == "__main__":
    from flows.entry import run_main

    run_main(pipeline_flow, name="flows.pipeline")
