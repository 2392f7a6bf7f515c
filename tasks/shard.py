"""Prefect tasks around shards: sharding a curation output (one call of
:func:`vfm_core.data.make_shards.shard_clips_dir`, the index contract checked at the boundary) and
adding the tokenizer's latents to a shard dataset (:func:`vfm_core.tokenizer.encode_shards.
encode_shards`); each returns a small JSON-able summary."""

from __future__ import annotations

from typing import Any

from prefect import task

from tasks.logs import task_logger
from tasks.retry import unless_input_error
from vfm_core.data.index import read_index
from vfm_core.data.make_shards import shard_clips_dir


@task(name="shard", retries=1, retry_delay_seconds=2, retry_condition_fn=unless_input_error)
def write_shards_task(
    clips_dir: str,
    shards_dir: str,
    *,
    target_shard_mb: float = 64.0,
    text_model: str | None = None,
    text_mode: str = "tokens",
) -> dict[str, Any]:
    """Shard a curation output directory; the returned summary names the validated index."""
    logger = task_logger()
    summary = shard_clips_dir(
        clips_dir,
        shards_dir,
        target_shard_mb=target_shard_mb,
        text_model=text_model,
        text_mode=text_mode,
    )
    index = read_index(shards_dir)  # contract: a pandera-valid index with every sample
    if len(index) != summary["n_samples"]:
        raise RuntimeError(
            f"{summary['index']}: {len(index)} samples, wrote {summary['n_samples']}"
        )
    logger.info(
        "%d samples in %d shards (%.1f MB) -> %s",
        summary["n_samples"],
        summary["n_shards"],
        summary["bytes"] / 1e6,
        summary["index"],
    )
    return summary


@task(name="encode-shards", retries=1, retry_delay_seconds=5, retry_condition_fn=unless_input_error)
def encode_latents(src: str, dst: str, *, tokenizer: str, overwrite: bool = False) -> dict:
    """Copy the shard dataset ``src`` to ``dst`` adding ``{key}.latent.npy`` (pre-encoded latents
    for training without video decoding); returns the summary (index URL, counts, seconds)."""
    from dataclasses import asdict

    from vfm_core.tokenizer.encode_shards import encode_shards

    # progress: the library's "encoding latents" lines (the vfm_core logger is in the run log)
    return asdict(encode_shards(src, dst, tokenizer=tokenizer, overwrite=overwrite))
