"""Generation flow: a trained checkpoint + prompts -> videos and an evaluation, all as artifacts
and metrics of one MLflow run.

Thin by design: parameters are a pydantic model (the Prefect UI renders it as a form); each video
is one task calling the generation library (the request built from the form's fields; torchrun
with ``nproc`` context-parallel ranks through the one launcher), the evaluation one task, MLflow
logging one task. Never imports torch.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from prefect import flow
from pydantic import Field, field_validator

from flows.forms import Form, with_deployment_defaults
from tasks.events import emit_stage_completed
from tasks.generate import (
    check_generation,
    evaluate_checkpoint,
    generate_video,
    log_evaluation,
    log_generation,
)
from tasks.tracking import end_mlflow_run, start_mlflow_run
from vfm_core.config import TrackingConfig
from vfm_core.tracking import STAGE_TAG, data_dir, ui_hint


def described(prompts: list[str]) -> list[str]:
    """Field validator of a form's prompts: each describes a video (stripped; none empty)."""
    empty = [i for i, p in enumerate(prompts) if not p.strip()]
    if empty:
        raise ValueError(f"prompts {empty} are empty; every prompt must describe a video")
    return [p.strip() for p in prompts]


class GenerateParams(Form):
    """Form of the generation flow."""

    checkpoint: str = Field(
        ...,
        description="run directory written by `vfm train`, or a registered version: "
        "models:/vfm-dit-tiny@champion, models:/NAME/VERSION",
    )
    prompts: list[str] = Field(
        default_factory=lambda: ["a red circle moving right"],
        min_length=1,
        description="one video per prompt",
    )
    frames: int = Field(
        13,
        ge=1,
        le=1025,
        description="frames (rounded up to 1 + t·k, t the tokenizer's temporal factor)",
    )
    size: str = Field("64x64", description="HxW in pixels")
    seed: int = Field(0, ge=0, description="noise seed (prompt i uses seed + i)")
    steps: int | None = Field(None, ge=1, le=1000, description="sampler steps (None: config)")
    guidance: float | None = Field(None, ge=0, le=30, description="classifier-free guidance")
    temperature: float = Field(
        1.0, ge=0, le=10, description="autoregressive: token draws' temperature (0 = greedy)"
    )
    top_k: int = Field(0, ge=0, description="autoregressive: draw from the k likeliest (0 = all)")
    tokenizer: str | None = Field(None, description="tokenizer dir (None: the run's)")
    nproc: int = Field(1, ge=1, le=64, description="context-parallel ranks per video")
    max_memory_gib: float | None = Field(
        None, gt=0, description="refuse a video estimated above this memory (None: 75% of free)"
    )
    max_minutes: float = Field(
        10.0, gt=0, description="refuse a video estimated to take longer than this"
    )
    force: bool = Field(False, description="generate a video over a bound anyway (a warning)")
    out_dir: str = Field(
        "", description="where videos go ('' = data/generated/RUN_NAME/FLOW_RUN_NAME: new per run)"
    )
    evaluate: bool = Field(True, description="held-out loss + Fréchet distance of the checkpoint")
    eval_samples: int = Field(16, ge=2, le=1024, description="held-out samples for evaluation")
    eval_prompts: int = Field(
        40,
        ge=0,
        le=40,
        description="vocabulary prompts ('a red circle "
        "moving right', ...) generated and read back in the evaluation",
    )
    experiment: str = Field("vfm-generate", description="MLflow experiment")

    _prompts = field_validator("prompts")(described)

    @field_validator("size")
    @classmethod
    def _size(cls, v: str) -> str:
        if not re.fullmatch(r"[1-9]\d*x[1-9]\d*", v):
            raise ValueError(f"size {v!r}: expected HxW, e.g. 64x64")
        return v

    def resolved_out(self) -> Path:
        """out_dir, or a new folder per flow run under the checkpoint's name (two runs both
        named ``run``, or two flow runs of one, wrote over each other's videos)."""
        if self.out_dir:
            return Path(self.out_dir)
        from prefect.runtime import flow_run

        name = Path(self.checkpoint.rstrip("/")).name or "checkpoint"
        return data_dir() / "generated" / name / (flow_run.get_name() or "run")


def evaluated_run(
    checkpoint: str,
    tracking: TrackingConfig,
    *,
    tags: dict[str, str],
    parent_run_id: str | None,
    sheet_dir: Path,
    **evaluation: Any,
) -> tuple[dict[str, float], str, str | None]:
    """The checkpoint's evaluation (``tasks.generate.evaluate_checkpoint`` with ``evaluation``)
    in its own MLflow run ``evaluate <checkpoint>`` under ``parent_run_id``, with the
    prompt-following contact sheet written to ``sheet_dir``: (metrics, the evaluation run's id,
    the sheet's path or None). The run ends FAILED with the error when the evaluation fails."""
    run_id = start_mlflow_run(
        tracking,
        {**tags, STAGE_TAG: "evaluate"},
        parent_run_id=parent_run_id,
        name=f"evaluate {Path(checkpoint.rstrip('/')).name}",
    )
    sheet: str | None = str(sheet_dir / "prompt_following.png")
    Path(sheet).unlink(missing_ok=True)  # an earlier run's
    try:
        metrics = evaluate_checkpoint(checkpoint, contact_sheet=sheet, **evaluation)
        if not Path(sheet).is_file():  # no vocabulary clips (no tokenizer or captions)
            sheet = None
        log_evaluation(run_id, tracking, metrics, [sheet] if sheet else [])
    except BaseException as e:
        end_mlflow_run(tracking, run_id, error=f"{type(e).__name__}: {e}")
        raise
    end_mlflow_run(tracking, run_id)
    return metrics, run_id, sheet


@flow(name="generate", log_prints=True)
def generate_flow(params: GenerateParams, parent_run_id: str | None = None) -> dict[str, Any]:
    """Videos for the prompts (MLflow run ``generate …``) and, with ``evaluate``, the checkpoint's
    evaluation (run ``evaluate …``); both nested under ``parent_run_id`` (the pipeline's run) when
    given, else the evaluation under the generation."""
    params = with_deployment_defaults(params)  # a trigger's run: the deployment's settings
    tracking = TrackingConfig(experiment=params.experiment)
    ckpt = Path(params.checkpoint).name
    tags = {"source": "prefect", "checkpoint": params.checkpoint}
    out = params.resolved_out()
    videos_at = [str(out / f"video_{i:03d}.mp4") for i in range(len(params.prompts))]
    options = {
        "frames": params.frames,
        "size": params.size,
        "steps": params.steps,
        "guidance": params.guidance,
        "temperature": params.temperature,
        "top_k": params.top_k,
        "tokenizer": params.tokenizer,
        "nproc": params.nproc,
        "max_memory_gib": params.max_memory_gib,
        "max_minutes": params.max_minutes,
        "force": params.force,
    }
    # every video's request checked (checkpoint, family's settings, plan) before the MLflow run
    check_generation(params.checkpoint, params.prompts, videos_at, seed=params.seed, **options)
    run_id = start_mlflow_run(
        tracking,
        {**tags, STAGE_TAG: "generate"},
        parent_run_id=parent_run_id,
        name=f"generate {ckpt} ({len(params.prompts)} prompts)",
    )
    done_eval = prompt_sheet = None
    try:
        videos = [
            generate_video(params.checkpoint, prompt, at, seed=params.seed + i, **options)
            for i, (prompt, at) in enumerate(zip(params.prompts, videos_at, strict=True))
        ]
        logged = log_generation(
            run_id,
            tracking,
            videos=videos,
            prompts=params.prompts,
            params={**params.model_dump(exclude={"prompts"}), "n_prompts": len(params.prompts)},
        )
        metrics = None
        if params.evaluate:
            metrics, done_eval, prompt_sheet = evaluated_run(
                params.checkpoint,
                tracking,
                tags=tags,
                parent_run_id=parent_run_id or run_id,
                sheet_dir=out,
                tokenizer=params.tokenizer,
                samples=params.eval_samples,
                prompts=params.eval_prompts,
                temperature=params.temperature,
                top_k=params.top_k,
            )
    except BaseException as e:
        end_mlflow_run(tracking, run_id, error=f"{type(e).__name__}: {e}")
        raise
    end_mlflow_run(tracking, run_id)
    print(f"{len(videos)} video(s) in {out}; MLflow run {run_id} -> {ui_hint(tracking)}")
    if metrics:
        print(
            "evaluation: "
            + ", ".join(f"{k} {v:.4f}" for k, v in metrics.items() if k != "checkpoint_step")
        )
    emit_stage_completed(
        "generate",
        {
            "out_dir": str(out),
            "mlflow_run_id": run_id,
            "eval_run_id": done_eval,
            "metrics": metrics,
        },
    )
    return {
        "mlflow_run_id": run_id,
        "videos": videos,
        "metrics": metrics,
        "out_dir": str(out),
        "eval_run_id": done_eval,
        "prompt_sheet": prompt_sheet,
        **logged,
    }
