"""Curation output directory -> shard directory: what ``vfm shard CLIPS_DIR SHARDS_DIR`` and the
shard task run.

``CLIPS_DIR`` is curation's destination: ``clips.parquet`` (``clip_id, video_id, source_uri,
start_s, end_s, uri, caption`` + sizes and scores) with clip MP4s under ``clips/`` (``uri``
absolute or relative to ``CLIPS_DIR``). Both directories may be local or ``s3://``.
"""

from __future__ import annotations

import time
from typing import Any

import pandas as pd

from vfm_core import storage
from vfm_core.annotate.text_encoder import TextEncoder, TextSpec
from vfm_core.data.foreign_index import WRITER as FOREIGN_WRITER
from vfm_core.data.index import index_writer, read_index
from vfm_core.data.shards import (
    ShardError,
    ShardWriterConfig,
    check_directory,
    remove_stale_shards,
    verify_shards,
    write_shards,
)
from vfm_core.output_lock import output_lock

MANIFEST = "clips.parquet"


def read_clips_manifest(clips_dir: str) -> pd.DataFrame:
    """``clips_dir/clips.parquet`` as a DataFrame, with a clear error when absent or unreadable."""
    url = storage.join(clips_dir, MANIFEST)
    try:
        data = storage.read_bytes(url)
    except storage.StorageError as e:
        raise ShardError(url, f"cannot read the clips manifest ({e.reason})") from None
    try:
        return storage.parquet_table(data).to_pandas()
    except (ValueError, OSError) as e:
        raise ShardError(url, f"not a parquet file ({e})") from None


def shard_clips_dir(
    clips_dir: str,
    shards_dir: str,
    *,
    target_shard_mb: float = 64.0,
    text_model: str | None = None,
    text_mode: str = "tokens",
    index_format: str = "json",
) -> dict[str, Any]:
    """Write shards + ``index.json`` for a curation output; verify them; return a summary.
    Clips that do not decode are left out (``rejected``: clip_id, uri, reason); shards of an
    earlier run into ``shards_dir`` that the new, verified index does not list are removed
    (``stale_shards_removed``: only names ``shard-NNNNNN.tar``, as the writer names them).
    ``text_mode``: ``tokens`` stores per-token caption embeddings (L, D), ``pooled`` one vector;
    the index meta ``text`` records the encoder and its null (empty-caption) embedding. One
    writer per ``shards_dir`` (:mod:`vfm_core.output_lock`): a second is refused, naming the
    first."""
    t0 = time.perf_counter()
    check_directory(clips_dir, "CLIPS_DIR")
    check_directory(shards_dir, "SHARDS_DIR")
    if index_writer(shards_dir) == FOREIGN_WRITER:
        raise ShardError(
            str(shards_dir),
            "holds a dataset indexed by `vfm index` (foreign tars + index.json): "
            "write the shards to another directory",
        )
    # one writer per SHARDS_DIR: held from the first write to the removal of stale shards
    with output_lock(shards_dir, what="SHARDS_DIR"):
        return _shard_locked(
            clips_dir,
            shards_dir,
            target_shard_mb=target_shard_mb,
            text_model=text_model,
            text_mode=text_mode,
            index_format=index_format,
            t0=t0,
        )


def _shard_locked(
    clips_dir: str,
    shards_dir: str,
    *,
    target_shard_mb: float,
    text_model: str | None,
    text_mode: str,
    index_format: str,
    t0: float,
) -> dict[str, Any]:
    """:func:`shard_clips_dir` once the writer lock of ``shards_dir`` is held."""
    clips = read_clips_manifest(clips_dir)
    encoder = TextEncoder(TextSpec(model=text_model, mode=text_mode))
    cfg = ShardWriterConfig(target_shard_bytes=int(target_shard_mb * (1 << 20)))
    write_shards(
        clips,
        shards_dir,
        embed=encoder.encode,
        config=cfg,
        index_format=index_format,
        base_url=clips_dir,
        meta={
            "clips_dir": str(clips_dir),
            "text_model": text_model or "all-MiniLM-L6-v2",
            "text": encoder.record(),
        },
    )
    index = read_index(shards_dir)  # read back what a loader will see
    verify_shards(index, checksum=True)
    # only now, the new index verified: shards of an earlier run that it does not list
    stale = remove_stale_shards(shards_dir, cfg.prefix, set(index.shards["name"]))
    return {
        "shards_dir": str(shards_dir),
        "index": storage.join(shards_dir, "index.json"),
        "n_samples": len(index),
        "n_shards": len(index.shards),
        "bytes": int(index.shards["bytes"].sum()),
        "images": int(sum((g[:, 0] == 1).sum() for g in index.iter_geometries())),
        "embedding_dim": index.embedding_dim,
        "text_mode": text_mode,
        "index_format": index_format,
        "captions_truncated": encoder.truncated,
        "rejected": index.meta.get("rejected", []),
        "stale_shards_removed": stale,
        "seconds": round(time.perf_counter() - t0, 2),
    }
