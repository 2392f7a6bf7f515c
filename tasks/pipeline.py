"""Prefect tasks of the end-to-end pipeline that are not a stage flow of their own: the built-in
sample, the tokenizer trained on the shards and its geometry, stage markers (resume after the last
finished stage) and the dataset lineage of the training run in MLflow."""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path
from typing import Any

from prefect import task

from tasks.logs import task_logger
from vfm_core.tracking import log_lineage


def stage_marker(work_dir: str, stage: str) -> Path:
    return Path(work_dir) / "stages" / f"{stage}.json"


def stage_key(inputs: dict[str, Any]) -> str:
    """Fingerprint of what a stage depends on (its parameters and its upstream summaries)."""
    blob = json.dumps(inputs, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def finished_stage(work_dir: str, stage: str, key: str) -> dict[str, Any] | None:
    """The summary a finished ``stage`` left for the same inputs ``key``, or None (never run,
    run with other inputs, or its outputs are gone)."""
    path = stage_marker(work_dir, stage)
    if not path.exists():
        return None
    done = json.loads(path.read_text())
    if done.get("key") != key:
        return None
    if any(not Path(p).exists() for p in done.get("outputs", [])):
        return None  # outputs deleted since: run the stage again
    return done["summary"]


def mark_stage(
    work_dir: str, stage: str, key: str, summary: dict[str, Any], outputs: list[str]
) -> None:
    path = stage_marker(work_dir, stage)
    path.parent.mkdir(parents=True, exist_ok=True)
    record = {
        "stage": stage,
        "key": key,
        "finished": time.time(),
        "outputs": outputs,
        "summary": summary,
    }
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(record, indent=1, default=str))
    tmp.replace(path)


@task(name="sample-videos")
def sample_videos_task(dst: str, n: int) -> str:
    """Write the built-in synthetic sample (videos with known cuts and sidecar captions)."""
    from vfm_core.video.sample_set import write_sample_videos

    paths = write_sample_videos(dst, n=n)
    task_logger().info("%d sample videos in %s", len(paths), dst)
    return dst


@task(name="train-tokenizer", retries=1, retry_delay_seconds=2)
def tokenizer_task(
    shards: str, out_dir: str, *, preset: str, steps: int, frames: int, size: int
) -> dict[str, Any]:
    """Train the causal video tokenizer on the shards' clips; returns its dir and PSNR."""
    from vfm_core.tokenizer.from_shards import train_tokenizer_on_shards

    m = train_tokenizer_on_shards(
        shards, out_dir, preset=preset, steps=steps, frames=frames, size=size, progress=False
    )
    task_logger().info(
        "tokenizer %s: %d steps, loss %.4f -> %.4f, PSNR %.1f dB (mean-colour baseline %.1f)",
        preset,
        m.steps,
        m.loss_first,
        m.loss_last,
        m.psnr,
        m.baseline_psnr,
    )
    return {
        "dir": out_dir,
        "preset": preset,
        "steps": m.steps,
        "psnr": m.psnr,
        "baseline_psnr": m.baseline_psnr,
        "ssim": m.ssim,
        "baseline_ssim": m.baseline_ssim,
        "codebook_usage": m.codebook_usage,
    }


@task(name="tokenizer-geometry")
def tokenizer_geometry(tokenizer: str) -> dict[str, int]:
    """The tokenizer's compression from its own saved config (no weights are read):
    ``temporal_factor`` t (1 + t·k frames -> 1 + k latent frames), ``spatial_factor`` s (H x W
    -> H/s x W/s) and ``latent_channels``."""
    from vfm_core.infer.request import tokenizer_config
    from vfm_core.tokenizer.config import TokenizerConfigError

    cfg = tokenizer_config(tokenizer)
    if cfg is None:
        raise TokenizerConfigError(
            f"tokenizer {tokenizer}: no readable config (tokenizer.safetensors metadata or "
            "config.json); name a tokenizer directory written by vfm tokenizer train"
        )
    return {
        "temporal_factor": cfg.temporal_factor,
        "spatial_factor": cfg.spatial_factor,
        "latent_channels": cfg.latent_channels,
    }


@task(name="lineage", retries=2, retry_delay_seconds=2)
def lineage_task(
    run_id: str, experiment: str, *, clips: str, shards: str, tokenizer: str | None
) -> None:
    """Link the training run to the manifests it learned from (MLflow datasets + tags)."""
    log_lineage(run_id, experiment=experiment, clips=clips, shards=shards, tokenizer=tokenizer)
