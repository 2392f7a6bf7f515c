"""The whole pipeline as one Prefect DAG: sample → curate → shard → tokenizer → encode latents →
train → generate → report. Each stage is a flow (or task) usable alone; this flow only composes
them.

Resumable: a finished stage leaves ``WORK/stages/<stage>.json`` (its summary and outputs), and a
rerun skips every stage whose marker and outputs are still there, so a crash in ``train`` keeps
the clips, shards and tokenizer and the rerun starts at ``train``. A failing stage fails the flow
with the stage named. Hand-overs are URIs checked against the pandera contracts by the stage
tasks (clips.parquet → shard index → checkpoint). The training run in MLflow carries the dataset
lineage (clips manifest and shard index as MLflow dataset inputs). Never imports torch.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from prefect import flow
from prefect.artifacts import create_markdown_artifact
from pydantic import BaseModel, Field, field_validator, model_validator

from flows.curate import CurateParams, curate_flow
from flows.generate import GenerateParams, generate_flow
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
    finished_stage,
    lineage_task,
    mark_stage,
    sample_videos_task,
    stage_key,
    tokenizer_geometry,
    tokenizer_task,
)
from tasks.shard import encode_latents
from tasks.tracking import end_mlflow_run, log_to_run, start_mlflow_run
from vfm_core.config import TrackingConfig
from vfm_core.curate.config import CurateConfig
from vfm_core.tracking import CHECKPOINT_TAG, STAGE_TAG, data_dir, tracking_uri, ui_hint


class PipelineStageError(RuntimeError):
    """A stage failed; earlier stages' outputs are kept and a rerun resumes at this stage."""


class PipelineParams(BaseModel):
    """Form of the end-to-end pipeline."""

    name: str = Field("demo", min_length=1, pattern=r"^[A-Za-z0-9_.-]+$", description="run name")
    src: str = Field("", description="raw videos: folder or s3:// prefix ('' = built-in sample)")
    sample_videos: int = Field(3, ge=1, le=256, description="built-in sample size (src = '')")
    work_dir: str = Field("", description="outputs ('' = data/pipeline/NAME)")
    splitter: str = Field("color", pattern="^(color|stride|transnetv2)$", description="shots")
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
    generate_steps: int = Field(24, ge=1, le=1000, description="sampler steps per video")
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
    _family = model_validator(mode="after")(settle_family)

    def tokenizer_preset(self) -> str:
        """The tokenizer trained when none is given: continuous, or discrete for the AR family."""
        return "tok-tiny-discrete" if self.family == "autoregressive" else "tok-tiny"

    def work(self) -> str:
        return self.work_dir or str(data_dir() / "pipeline" / self.name)


def _stage(
    work: str,
    name: str,
    inputs: dict[str, Any],
    run: Callable[[], dict[str, Any]],
    outputs: Callable[[dict[str, Any]], list[str]],
    *,
    reused: list[str],
) -> dict[str, Any]:
    """Run one stage unless a finished run with the same ``inputs`` left its outputs (its name
    then goes to ``reused``). A stage that made an MLflow run records the store it is in."""
    key = stage_key(inputs)
    done = finished_stage(work, name, key)
    if done is not None:
        print(f"stage {name}: done in an earlier run, skipped")
        reused.append(name)
        return done
    try:
        summary = run()
    except Exception as e:
        raise PipelineStageError(
            f"pipeline stage '{name}' failed: {type(e).__name__}: {e} (outputs of the earlier "
            f"stages are kept under {work}; rerun to resume at '{name}')"
        ) from e
    if summary.get("mlflow_run_id"):  # where its run is, for a later pipeline run that reuses it
        summary = {**summary, "tracking_uri": tracking_uri()}
    mark_stage(work, name, key, summary, outputs(summary))
    return summary


@flow(name="pipeline", log_prints=True)
def pipeline_flow(params: PipelineParams | None = None) -> dict[str, Any]:
    p = params or PipelineParams()
    work = p.work()
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


HEADLINE = (
    "prompt_colour_acc",
    "prompt_direction_acc",
    "prompt_colour_acc_held_out",
    "prompt_direction_acc_held_out",
    "untrained_prompt_colour_acc",
    "untrained_prompt_direction_acc",
    "fd_ratio_untrained",
    "loss_reduction",
    "frechet_distance",
    "untrained_frechet_distance",
    "fd_data_halves",
    "heldout_loss",
    "heldout_bits_per_token",
)
"""Evaluation metrics repeated on the pipeline's own MLflow run (compare pipelines at a glance)."""


def headline_metrics(out: dict[str, Any]) -> dict[str, float]:
    """The pipeline run's metrics: :data:`HEADLINE` of the evaluation and the tokenizer's PSNR /
    SSIM next to their mean-colour baselines."""
    m = out.get("generate", {}).get("metrics") or {}
    got = {k: float(m[k]) for k in HEADLINE if k in m}
    tok = out.get("tokenizer", {})
    for k in ("psnr", "baseline_psnr", "ssim", "baseline_ssim"):
        v = tok.get(k)
        if isinstance(v, (int, float)) and math.isfinite(v):
            got[f"tokenizer_{k}"] = float(v)
    return got


def train_settings(
    p: PipelineParams, *, latents: str, tokenizer: str, geometry: dict[str, int]
) -> dict[str, Any]:
    """The training form's config values (typed, by dotted key) for the pipeline's own data:
    the encoded shards, the tokenizer, the latent grid, the tokenizer's latent channels
    (diffusion), a checkpoint every 100 steps; ``p.overrides`` still win over them."""
    t, h, w = p.latent_grid
    settings: dict[str, Any] = {
        "data.source": "shards",
        "data.shards": latents,
        "data.tokenizer": tokenizer,
        "data.latent_frames": t,
        "data.latent_height": h,
        "data.latent_width": w,
        "diffusion.sigma_data": 1.0,  # encode-shards writes unit-variance latents
        "train.ckpt_every": 100,
    }
    if p.family == "diffusion":  # the DiT denoises the tokenizer's latents
        settings["model.in_channels"] = geometry["latent_channels"]
    return settings


def pixel_shape(latent_grid: tuple[int, int, int], geometry: dict[str, int]) -> tuple[int, str]:
    """(frames, "HxW") of videos whose latent is ``latent_grid`` (T, H, W) under the tokenizer's
    ``geometry`` (:func:`tasks.pipeline.tokenizer_geometry`): 1 + t·(T - 1) frames of s·H x s·W."""
    t, h, w = latent_grid
    t_c, s = geometry["temporal_factor"], geometry["spatial_factor"]
    return 1 + t_c * (t - 1), f"{s * h}x{s * w}"


def _run_stages(p: PipelineParams, work: str, parent: str) -> dict[str, Any]:
    out: dict[str, Any] = {"work_dir": work, "reused": []}
    reused = out["reused"]  # stages finished by an earlier run of this pipeline, skipped now

    src = p.src or f"{work}/raw"
    if not p.src:
        _stage(
            work,
            "sample",
            {"n": p.sample_videos},
            lambda: {"dir": sample_videos_task(src, p.sample_videos)},
            lambda s: [s["dir"]],
            reused=reused,
        )

    curate_in = {"src": src, "splitter": p.splitter, "min": p.min_len_s, "max": p.max_len_s}
    curate = _stage(
        work,
        "curate",
        curate_in,
        lambda: curate_flow(
            CurateParams(
                src=src,
                dst=f"{work}/curated",
                splitter=p.splitter,
                min_len_s=p.min_len_s,
                max_len_s=p.max_len_s,
            )
        ),
        lambda s: [s["clips"]],
        reused=reused,
    )
    out["curate"] = curate
    shard = _stage(
        work,
        "shard",
        {"curate": curate},
        lambda: shard_flow(ShardParams(clips_dir=f"{work}/curated", shards_dir=f"{work}/shards")),
        lambda s: [s["index"]],
        reused=reused,
    )
    out["shard"] = shard

    tok_dir = p.tokenizer
    if not tok_dir:
        # the tokenizer is fully convolutional and causal: it trains on small crops (5 frames of
        # 32 x 32) and encodes clips of any 1 + 4k frames and multiple-of-8 size
        tok_in = {"shard": shard, "steps": p.tokenizer_steps, "preset": p.tokenizer_preset()}
        tok = _stage(
            work,
            "tokenizer",
            tok_in,
            lambda: tokenizer_task(
                f"{work}/shards",
                f"{work}/tokenizer",
                preset=p.tokenizer_preset(),
                steps=p.tokenizer_steps,
                frames=5,
                size=32,
            ),
            lambda s: [s["dir"]],
            reused=reused,
        )
        out["tokenizer"] = tok
        tok_dir = tok["dir"]

    enc = _stage(
        work,
        "encode",
        {"shard": shard, "tokenizer": out.get("tokenizer", tok_dir)},
        lambda: {
            **encode_latents(f"{work}/shards", f"{work}/latents", tokenizer=tok_dir),
            "dir": f"{work}/latents",
        },
        lambda s: [s["index"]],
        reused=reused,
    )
    out["encode"] = enc

    geometry = tokenizer_geometry(tok_dir)  # the tokenizer's own saved config
    train_params = TrainParams(
        family=p.family,
        recipe=p.recipe,
        steps=p.train_steps,
        out_dir=f"{work}/train",
        experiment=p.experiment,
        settings=train_settings(p, latents=enc["dir"], tokenizer=tok_dir, geometry=geometry),
        overrides=p.overrides,
    )

    def run_train() -> dict[str, Any]:
        summary = train_flow(train_params, parent_run_id=parent)
        if summary.get("mlflow_run_id"):
            lineage_task(
                summary["mlflow_run_id"],
                p.experiment,
                clips=curate["clips"],
                shards=shard["index"],
                tokenizer=tok_dir,
            )
        return summary

    train_in = {
        "shard": enc,
        "tokenizer": out.get("tokenizer", tok_dir),
        "params": train_params.model_dump(),
    }
    train = _stage(work, "train", train_in, run_train, lambda s: [s["checkpoint"]], reused=reused)
    out["train"] = train

    if p.prompts:
        frames, size = pixel_shape(p.latent_grid, geometry)
        gen_params = GenerateParams(
            checkpoint=f"{work}/train",
            prompts=p.prompts,
            frames=frames,
            size=size,
            steps=p.generate_steps,
            tokenizer=tok_dir,
            out_dir=f"{work}/generated",
            experiment=p.experiment,
            eval_samples=p.eval_samples,
            eval_prompts=p.eval_prompts,
        )
        out["generate"] = _stage(
            work,
            "generate",
            {"train": train, "params": gen_params.model_dump()},
            lambda: generate_flow(gen_params, parent_run_id=parent),
            lambda s: [v["mp4"] for v in s["videos"]],
            reused=reused,
        )

    report = _report(p, out, parent)
    out["report"] = report
    print(report)
    return out


def _report(p: PipelineParams, out: dict[str, Any], parent: str) -> str:
    tr = out["train"]
    final = tr.get("final", {})
    lines = [
        f"# vfm pipeline `{p.name}`",
        "",
        "| stage | result |",
        "|---|---|",
        f"| curate | {out['curate']['n_clips']} clips, {out['curate']['n_rejects']} rejects: "
        f"`{out['curate']['clips']}` |",
        f"| shard | {out['shard']['n_samples']} samples in {out['shard']['n_shards']} shards: "
        f"`{out['shard']['index']}` |",
    ]
    if "tokenizer" in out:
        tk = out["tokenizer"]
        ssim = (
            f", SSIM {tk['ssim']:.3f} (baseline {tk['baseline_ssim']:.3f})" if "ssim" in tk else ""
        )
        usage = tk.get("codebook_usage")
        if usage is not None and not math.isnan(usage):  # a discrete tokenizer
            ssim += f", {usage:.1%} of the codebook used"
        lines.append(
            f"| tokenizer | {tk['preset']}, PSNR {tk['psnr']:.1f} dB "
            f"(mean-colour baseline {tk['baseline_psnr']:.1f}){ssim}: `{tk['dir']}` |"
        )
    lines.append(
        f"| train | {p.recipe} {tr['step']} steps, loss {final.get('loss', float('nan')):.4f}, "
        f"MFU {final.get('mfu', 0):.1%}, MLflow run `{tr.get('mlflow_run_id')}` |"
    )
    if "generate" in out:
        g = out["generate"]
        m = g.get("metrics") or {}
        videos = ", ".join(f"`{v['mp4']}`" for v in g["videos"])
        if "heldout_bits_per_token" in m:  # autoregressive
            evaluation = (
                f"; held-out {m['heldout_bits_per_token']:.2f} bits/token (uniform "
                f"{m['uniform_bits_per_token']:.2f})"
            )
        elif m:
            evaluation = (
                f"; held-out loss {m['heldout_loss']:.4f}, Fréchet distance "
                f"{m['frechet_distance']:.3f}"
            )
            if "fd_ratio_untrained" in m:
                evaluation += (
                    f" ({m['fd_ratio_untrained']:.1f}x lower than untrained "
                    f"{m['untrained_frechet_distance']:.3f}"
                )
                if "fd_data_halves" in m:  # the floor of this sample size
                    evaluation += (
                        f"; two halves of the data: {m['fd_data_halves']:.3f} at "
                        f"{int(m['fd_samples']) // 2} clips each"
                    )
                evaluation += f"; held-out loss {m['loss_reduction']:.0%} lower)"
        else:
            evaluation = ""
        lines.append(f"| generate | {len(g['videos'])} videos{evaluation}: {videos} |")
        if "prompt_colour_acc" in m:
            lines.append(_following_row(m, g.get("prompt_sheet")))
        if g.get("prompt_following"):
            pf = g["prompt_following"]
            held = (
                f"; held-out combinations: colour {pf['colour_acc_held_out']:.0%}, direction "
                f"{pf['direction_acc_held_out']:.0%}"
                if "colour_acc_held_out" in pf
                else ""
            )
            lines.append(
                f"| your prompts | {int(pf['n_scored'])} generated videos read back from "
                f"the pixels: colour {pf['colour_acc']:.0%}, direction "
                f"{pf['direction_acc']:.0%}{held} |"
            )
        if g.get("contact_sheet"):
            lines.append(f"| contact sheet | one row per prompt: `{g['contact_sheet']}` |")
    lines += ["", _runs_line(p, out, parent)]
    text = "\n".join(lines)
    Path(out["work_dir"], "report.md").write_text(text + "\n")
    create_markdown_artifact(
        text,
        key=f"pipeline-{p.name.lower().replace('_', '-')}".replace(".", "-"),
        description="vfm pipeline summary",
    )
    return text


def _following_row(m: dict[str, float], sheet: str | None) -> str:
    """Report row of the evaluation's vocabulary prompts: accuracies, trained vs untrained."""

    def pair(key: str) -> str:
        base = m.get(f"untrained_{key}")
        return f"{m[key]:.0%}" + (f" (untrained {base:.0%})" if base is not None else "")

    text = (
        f"| prompt following | {int(m.get('prompt_n_scored', 0))} vocabulary prompts, "
        f"colour and direction read back from the pixels: colour {pair('prompt_colour_acc')},"
        f" direction {pair('prompt_direction_acc')}"
    )
    if "prompt_colour_acc_held_out" in m:
        text += (
            f"; held-out combinations: colour {m['prompt_colour_acc_held_out']:.0%}, "
            f"direction {m['prompt_direction_acc_held_out']:.0%}"
        )
    return text + (f"; one row per prompt: `{sheet}` |" if sheet else " |")


def _runs_line(p: PipelineParams, out: dict[str, Any], parent: str) -> str:
    """Where the runs are: the stages' MLflow runs are nested under this pipeline run when this
    run made them; a stage reused from an earlier run keeps its run where that run logged it."""
    made = [s for s in ("train", "generate") if s in out and s not in out["reused"]]
    head = f"Runs: {ui_hint()} (experiment `{p.experiment}`, pipeline run `{parent}`"
    nested = {"train": "train", "generate": "evaluate / generate"}
    if made:
        head += " with the " + " and ".join(nested[s] for s in made) + " runs nested under it"
    earlier = []
    for s in ("train", "generate"):
        summary = out.get(s, {})
        if s in out["reused"] and summary.get("mlflow_run_id"):
            uri = summary.get("tracking_uri")
            where = "" if uri in (None, tracking_uri()) else f" in the store {uri}"
            earlier.append(f"{s} run `{summary['mlflow_run_id']}`{where}")
    if earlier:
        head += (
            "; reused from an earlier run of this pipeline, not nested here: "
            + ", ".join(earlier)
            + "; `make clean` starts over"
        )
    return head + ")"


if __name__ == "__main__":
    pipeline_flow()
