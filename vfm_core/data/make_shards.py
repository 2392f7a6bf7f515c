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
from vfm_core.data.index import read_index
from vfm_core.data.shards import ShardError, ShardWriterConfig, verify_shards, write_shards

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
    ``text_mode``: ``tokens`` stores per-token caption embeddings (L, D), ``pooled`` one vector;
    the index meta ``text`` records the encoder and its null (empty-caption) embedding."""
    t0 = time.perf_counter()
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
        "seconds": round(time.perf_counter() - t0, 2),
    }
