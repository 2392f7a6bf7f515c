"""Prefect task around clip search: a text query -> a subset clips manifest, so a flow can build
a training subset ("clips of red cars") and shard it like any curated clips dir."""

from __future__ import annotations

from typing import Any

from prefect import task

from tasks.logs import task_logger
from tasks.retry import unless_input_error


@task(name="search-subset", retries=1, retry_delay_seconds=2, retry_condition_fn=unless_input_error)
def search_subset_task(clips_dir: str, query: str, top: int, out_dir: str) -> dict[str, Any]:
    """Write ``out_dir/clips.parquet``: the ``top`` clips of ``clips_dir`` whose captions best
    match ``query`` (same schema, best first, uris absolute) and ``out_dir/search.json`` (the
    query, source manifest digest and scores); returns their URLs, the count and the clip ids."""
    from vfm_core.search import ClipSearchConfig, search_clips, write_subset
    from vfm_core.search.manifest import read_manifest

    search, hits = search_clips(clips_dir, query, config=ClipSearchConfig(top_k=top))
    url, meta = write_subset(search, hits, out_dir, query)
    written = read_manifest(out_dir)  # contract: the subset as a reader sees it
    if not written.table.schema.equals(search.manifest.table.schema, check_metadata=False):
        raise RuntimeError(f"{url}: schema differs from {search.manifest.url}")
    if written.column("clip_id") != [h.clip_id for h in hits]:
        raise RuntimeError(f"{url}: rows differ from the {len(hits)} hits")
    task_logger().info(
        "%d clips for %r from %s (best %.3f) -> %s",
        len(hits),
        query,
        clips_dir,
        hits[0].score if hits else float("nan"),
        url,
    )
    return {
        "clips": url,
        "search": meta,
        "n_clips": len(hits),
        "clip_ids": [h.clip_id for h in hits],
    }
