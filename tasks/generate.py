"""Prefect tasks around generation: one call of the generation library per video (in this process,
or torchrun ranks through the one launcher when ``nproc`` > 1), one in-process evaluation of the
checkpoint, and one MLflow logging step. Each returns small serialisable results (paths, metric
dicts, run ids)."""

from __future__ import annotations

import json
import re
import warnings
from pathlib import Path
from typing import Any

from prefect import task

from tasks.logs import log_lines, task_logger
from tasks.retry import unless_input_error
from vfm_core.config import TrackingConfig
from vfm_core.errors import UserError

FORM_FIELDS = {
    "--checkpoint": "checkpoint",
    "--prompt": "prompts",
    "--frames": "frames",
    "--size": "size",
    "--seed": "seed",
    "--steps": "steps",
    "--guidance": "guidance",
    "--temperature": "temperature",
    "--top-k": "top_k",
    "--tokenizer": "tokenizer",
    "--nproc": "nproc",
    "--out": "out_dir",
    "--max-memory-gib": "max_memory_gib",
    "--max-minutes": "max_minutes",
    "--force": "force",
}
"""The generation library's flag names -> the generation form's fields, for its errors."""


def form_terms(text: str) -> str:
    """``text`` with the `vfm generate` flags it names put as the form's fields (a flow user
    has no flags: ``--max-minutes`` is the form's ``max_minutes``)."""
    return re.sub(r"--[a-z][a-z-]*", lambda m: FORM_FIELDS.get(m.group(0), m.group(0)), text)


def in_form_terms(e: UserError) -> UserError:
    """``e`` with its message in :func:`form_terms`."""
    said = form_terms(str(e))
    if said != str(e):
        e.args = (said,)
    return e


def _request(
    prompt: str,
    *,
    size: str,
    max_memory_gib: float | None = None,
    max_minutes: float | None = None,
    force: bool = False,
    **fields: Any,
):
    """The library's request for one video of the form's fields (``size`` "HxW"; the bounds)."""
    from vfm_core.infer.budget import MAX_MINUTES, GenerateBounds
    from vfm_core.infer.generate import GenerateRequest
    from vfm_core.infer.shapes import parse_size

    height, width = parse_size(size)
    bounds = GenerateBounds(
        max_memory_gib=max_memory_gib,
        max_minutes=MAX_MINUTES if max_minutes is None else max_minutes,
        force=force,
    ).check()
    # progress: a line every 10 s of long sampling through the library's logger, which the
    # flow run's log shows, as it shows the estimate before and the time taken after each video
    return GenerateRequest(prompt=prompt, height=height, width=width, bounds=bounds, **fields)


@task(name="check-generation")
def check_generation(
    checkpoint: str,
    prompts: list[str],
    outs: list[str],
    *,
    seed: int,
    tokenizer: str | None = None,
    nproc: int = 1,
    **fields: Any,
) -> None:
    """The cheap checks of every video's request (:func:`vfm_core.infer.run.check_request`:
    the checkpoint and its config, the prompt, the sampling settings for the run's family, the
    plan), before the flow starts its MLflow run: a bad input fails here, with its one line,
    not after an MLflow run was made (and left FAILED) or earlier videos were generated."""
    from vfm_core.infer.run import check_request

    try:
        for i, (prompt, out) in enumerate(zip(prompts, outs, strict=True)):
            request = _request(prompt, seed=seed + i, **fields)
            check_request(checkpoint, request, out, tokenizer=tokenizer, nproc=nproc)
    except UserError as e:
        e = in_form_terms(e)
        task_logger().error("generate: error: %s", e)
        raise e.with_traceback(None) from None


@task(name="generate-video")  # no retries: a failure is a user error or a bug, not transient
def generate_video(
    checkpoint: str,
    prompt: str,
    out: str,
    *,
    frames: int,
    size: str,
    seed: int,
    steps: int | None = None,
    guidance: float | None = None,
    temperature: float = 1.0,
    top_k: int = 0,
    tokenizer: str | None = None,
    nproc: int = 1,
    max_memory_gib: float | None = None,
    max_minutes: float | None = None,
    force: bool = False,
) -> dict[str, Any]:
    """One video for ``prompt`` (:func:`vfm_core.infer.run.generate_request`: in this process,
    or ``nproc`` context-parallel ranks through the one launcher, their output logged); returns
    its result (paths, shapes, timings). Bad input fails the task with its one-line message."""
    from vfm_core.infer.run import generate_request

    logger = task_logger()

    def log(line: str) -> None:  # the ranks' output (nproc > 1), without progress redraws
        for clean in log_lines(line):
            logger.info(clean)

    try:
        request = _request(
            prompt,
            frames=frames,
            size=size,
            seed=seed,
            steps=steps,
            guidance=guidance,
            temperature=temperature,
            top_k=top_k,
            max_memory_gib=max_memory_gib,
            max_minutes=max_minutes,
            force=force,
        )
        logger.info("generating %r -> %s on %d rank(s)", prompt, out, nproc)
        with warnings.catch_warnings(record=True) as caught:  # to the run's log, not stderr
            warnings.simplefilter("always")
            result = generate_request(
                checkpoint,
                request,
                out,
                tokenizer=tokenizer,
                nproc=nproc,
                on_line=log,
            )
        for w in caught:  # e.g. a prompt cut to the text model's length
            logger.warning("warning: %s", form_terms(str(w.message)))
    except UserError as e:  # a bad input: its one line, in the form's terms
        e = in_form_terms(e)
        logger.error("generate: error: %s", e)
        raise e.with_traceback(None) from None  # the message, not the library's frames
    return result.to_dict()


@task(name="evaluate-checkpoint")
def evaluate_checkpoint(
    checkpoint: str,
    *,
    tokenizer: str | None = None,
    samples: int = 16,
    steps: int = 12,
    contact_sheet: str = "",
    prompts: int = 40,
    temperature: float = 1.0,
    top_k: int = 0,
    concept: str = "",
    heldout_shards: str = "",
    untrained_baseline: bool = True,
    frame_prompts: int = 0,
) -> dict[str, float]:
    """Held-out EDM loss at fixed sigmas, Fréchet distance and prompt following of the vocabulary
    prompts (vfm_core.infer.evaluate), with a contact sheet of those clips at ``contact_sheet``;
    the autoregressive family draws its clips' tokens with ``temperature`` and ``top_k``.
    ``concept``: also the prompts of a fine-tuning run's new colour; ``heldout_shards``: the
    clips the loss and the Fréchet distance compare with ('' = the run's own); ``frame_prompts``:
    held-out clips continued from their first frame (EvalConfig.frame_prompts)."""
    from vfm_core.infer.evaluate import EvalConfig, evaluate

    ec = EvalConfig(
        loss_samples=samples,
        fd_samples=samples,
        steps=steps,
        batch=min(8, samples),
        contact_sheet=contact_sheet,
        prompt_following=prompts,
        temperature=temperature,
        top_k=top_k,
        concept=concept,
        heldout_shards=heldout_shards,
        untrained_baseline=untrained_baseline,
        frame_prompts=frame_prompts,
    )
    return evaluate(checkpoint, tokenizer=tokenizer, config=ec)


@task(
    name="log-generation", retries=2, retry_delay_seconds=2, retry_condition_fn=unless_input_error
)
def log_generation(
    run_id: str,
    tracking: TrackingConfig,
    *,
    videos: list[dict[str, Any]],
    prompts: list[str],
    params: dict[str, Any],
) -> dict[str, Any]:
    """Log the videos (MP4, GIF, latents / tokens under ``videos/``), a contact sheet (one row of
    frames per prompt, ``contact_sheet.png``), the prompt following of vocabulary prompts
    (``prompt/colour_acc``, ``prompt/direction_acc``, their held-out variants) and the parameters
    to the generation's MLflow run; returns ``{"contact_sheet": path | None, "prompt_following":
    metrics | None}``."""
    import mlflow
    from mlflow.entities import Metric, Param

    from vfm_core.infer.prompt_follow import score_videos
    from vfm_core.tracking import ensure_experiment
    from vfm_core.video.contact_sheet import VideoError, contact_sheet

    ensure_experiment(tracking)
    client = mlflow.MlflowClient()
    client.log_batch(run_id, params=[Param(k, str(v)[:6000]) for k, v in params.items()])
    for v in videos:
        for key in ("mp4", "gif", "latent", "tokens"):
            if v.get(key) and Path(v[key]).is_file():
                client.log_artifact(run_id, v[key], artifact_path="videos")
    out: dict[str, Any] = {"contact_sheet": None, "prompt_following": None}
    if not videos:
        return out
    folder = Path(videos[0]["mp4"]).parent
    mp4s = [v["mp4"] for v in videos]
    try:
        out["prompt_following"] = follow = score_videos(mp4s, prompts)
        sheet = contact_sheet(mp4s, prompts, folder / "contact_sheet.png")
    except VideoError as e:
        task_logger().warning("no contact sheet / prompt following: %s", e)
        return out
    out["contact_sheet"] = str(sheet)
    client.log_artifact(run_id, str(sheet))
    if follow:
        ts = int(mlflow.utils.time.get_current_time_millis())
        client.log_batch(
            run_id, metrics=[Metric(f"prompt/{k}", float(v), ts, 0) for k, v in follow.items()]
        )
    (folder / "generation.json").write_text(json.dumps({"videos": videos, **out}, indent=1))
    client.log_artifact(run_id, str(folder / "generation.json"))
    return out


@task(
    name="log-evaluation", retries=2, retry_delay_seconds=2, retry_condition_fn=unless_input_error
)
def log_evaluation(
    run_id: str,
    tracking: TrackingConfig,
    metrics: dict[str, float],
    artifacts: list[str] | None = None,
) -> None:
    """Log the evaluation metrics (``eval/…``, at the checkpoint's step) and ``artifacts`` (files
    that exist) to the evaluation run."""
    from tasks.tracking import log_to_run

    log_to_run.fn(
        tracking,
        run_id,
        list(artifacts or []),
        metrics={f"eval/{k}": v for k, v in metrics.items()},
        step=int(metrics.get("checkpoint_step", 0)),
    )
