"""Prefect tasks of the end-to-end pipeline that are not a stage flow of their own (the built-in
sample, the tokenizer trained on the shards and its geometry, the latents encoded with it, the
dataset lineage of the training run in MLflow) and the stages' cache.

The cache is Prefect's own: a stage task's cache key (:func:`stage_cache`) covers its inputs
(parameters, typed configs), its source, and the contents of the folders and files it reads
(:func:`vfm_core.storage.fingerprint`); its result is persisted as JSON (never pickle) with
:data:`STAGE_RESULTS`.
A changed input, or an upstream output whose content changed, gives a new key and the stage runs;
the same key answers from the cache (task state ``Cached``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from prefect import task
from prefect.cache_policies import INPUTS, TASK_SOURCE, CachePolicy
from prefect.context import TaskRunContext
from prefect.utilities.hashing import hash_objects

from tasks.logs import task_logger
from tasks.retry import unless_input_error
from tasks.shard import encode_latents
from vfm_core import storage
from vfm_core.tracking import log_lineage

STAGE_RESULTS: dict[str, Any] = {"persist_result": True, "result_serializer": "json"}
"""Task options of every stage: its result (a small summary dict) persisted as JSON, so that a
later run with the same cache key reads it back instead of running the stage. No expiration: a
stage stays done until an input changes or its output is deleted (``make clean`` starts over).
The results of the subflows and tasks a stage runs land there too (Prefect persists the results
of what runs inside a persisting task), as JSON as well."""


@dataclass
class ContentsOf(CachePolicy):
    """Cache-key part: the :func:`~vfm_core.storage.fingerprint` of every path the task reads,
    named by argument (``"shards"``) or by an attribute of one (``"params.src"``); None / ""
    values are skipped."""

    reads: tuple[str, ...] = field(default_factory=tuple)

    def compute_key(
        self,
        task_ctx: TaskRunContext,
        inputs: dict[str, Any],
        flow_parameters: dict[str, Any],
        **kwargs: Any,
    ) -> str | None:
        prints = {}
        for name in self.reads:
            arg, *attrs = name.split(".")
            value = inputs.get(arg)
            for attr in attrs:
                value = getattr(value, attr)
            if value:
                prints[name] = storage.fingerprint(str(value))
        return hash_objects(prints, raise_on_failure=True) if prints else None


def stage_cache(*reads: str, exclude: tuple[str, ...] = ()) -> CachePolicy:
    """Cache policy of a pipeline stage: its inputs (less ``exclude``: values that differ on every
    run, such as the pipeline's MLflow run id), its source and the contents of ``reads``."""
    inputs = INPUTS
    for name in exclude:
        inputs = inputs - name
    return inputs + TASK_SOURCE + ContentsOf(reads=reads)


@task(name="sample-videos", cache_policy=stage_cache(), **STAGE_RESULTS)
def sample_videos_task(dst: str, n: int) -> str:
    """Write the built-in synthetic sample (videos with known cuts and sidecar captions)."""
    from vfm_core.video.sample_set import write_sample_videos

    paths = write_sample_videos(dst, n=n)
    task_logger().info("%d sample videos in %s", len(paths), dst)
    return dst


@task(
    name="train-tokenizer",
    retries=1,
    retry_delay_seconds=2,
    retry_condition_fn=unless_input_error,
    cache_policy=stage_cache("shards"),
    **STAGE_RESULTS,
)
def tokenizer_task(
    shards: str, out_dir: str, *, preset: str, steps: int, frames: int, size: int
) -> dict[str, Any]:
    """Train the causal video tokenizer on the shards' clips; returns its dir and PSNR."""
    from vfm_core.perf.hardware import cpu_speed
    from vfm_core.tokenizer.from_shards import train_tokenizer_on_shards

    m = train_tokenizer_on_shards(
        shards, out_dir, preset=preset, steps=steps, frames=frames, size=size, progress=False
    )
    speed, util = cpu_speed(m.steps, m.seconds, m.train_flops_per_s)
    task_logger().info(
        "tokenizer %s: %d steps in %.0f s (%s), loss %.4f -> %.4f, PSNR %.1f dB (mean-colour "
        "baseline %.1f)",
        preset,
        m.steps,
        m.seconds,
        speed,
        m.loss_first,
        m.loss_last,
        m.psnr,
        m.baseline_psnr,
    )
    return {
        "dir": out_dir,
        "preset": preset,
        "steps": m.steps,
        "seconds": m.seconds,
        "mfu": util,
        "psnr": m.psnr,
        "baseline_psnr": m.baseline_psnr,
        "ssim": m.ssim,
        "baseline_ssim": m.baseline_ssim,
        "codebook_usage": m.codebook_usage,
    }


encode_stage = encode_latents.with_options(
    name="encode-latents", cache_policy=stage_cache("src", "tokenizer"), **STAGE_RESULTS
)
"""The latents stage: :func:`tasks.shard.encode_latents` cached on the shards and tokenizer read."""


@task(name="tokenizer-geometry")
def tokenizer_geometry(tokenizer: str) -> dict[str, int]:
    """The tokenizer's compression from its own saved config
    (:func:`vfm_core.tokenizer.run_settings.tokenizer_geometry`)."""
    from vfm_core.tokenizer.run_settings import tokenizer_geometry as geometry

    return geometry(tokenizer)


def caption_tokens(index_root: str) -> int | None:
    """The longest caption, in embedding tokens, of the shards at ``index_root`` (their index's
    ``caption_tokens`` meta, written by the shard writer and kept by the latent encoder); None
    for shards written without it."""
    from vfm_core.tokenizer.run_settings import caption_tokens as longest
    from vfm_core.tokenizer.run_settings import index_meta

    return longest(index_meta(index_root))


@task(name="lineage", retries=2, retry_delay_seconds=2, retry_condition_fn=unless_input_error)
def lineage_task(
    run_id: str, experiment: str, *, clips: str, shards: str, tokenizer: str | None
) -> None:
    """Link the training run to the manifests it learned from (MLflow datasets + tags)."""
    log_lineage(run_id, experiment=experiment, clips=clips, shards=shards, tokenizer=tokenizer)
