"""Shard flow: curation output directory -> WebDataset shards + dataset index.

Thin by design: parameters are a pydantic model (rendered as a form in the Prefect UI), the work
is one task. Never imports torch.
"""

from __future__ import annotations

from typing import Any, Literal

from prefect import flow
from pydantic import Field, model_validator

from flows.forms import Form, with_deployment_defaults
from tasks.events import emit_stage_completed
from tasks.search import search_subset_task
from tasks.shard import write_shards_task
from vfm_core import storage
from vfm_core.tracking import data_dir


class ShardParams(Form):
    """Form of the shard flow."""

    clips_dir: str = Field(..., description="curation output dir with clips.parquet (local/s3://)")
    shards_dir: str = Field(
        "",
        description="destination of shards + index.json (local/s3://; '' = data/shards/ + the "
        "clips folder's name)",
    )
    target_shard_mb: float = Field(64.0, gt=0, description="target shard size in MB")
    text_model: str | None = Field(None, description="caption encoder path (None = MiniLM-L6)")
    text_mode: Literal["tokens", "pooled"] = Field(
        "tokens", description="per-token caption embeddings (cross-attention) or one pooled vector"
    )
    query: str | None = Field(
        None,
        description="shard only the clips whose captions best match this text (clip search); "
        "the subset manifest and scores land in SHARDS_DIR/_query/",
    )
    query_top: int = Field(100, ge=1, description="with query: how many clips to keep")

    @model_validator(mode="after")
    def _query_top_needs_a_query(self) -> ShardParams:
        if "query_top" in self.model_fields_set and not self.query:
            raise ValueError("query_top: keeps the clips best matching query; give a query too")
        return self


@flow(name="shard", log_prints=True)
def shard_flow(params: ShardParams) -> dict[str, Any]:
    params = with_deployment_defaults(params)  # a trigger's run: the deployment's settings
    if not params.shards_dir:
        name = params.clips_dir.rstrip("/").rsplit("/", 1)[-1] or "clips"
        params = params.model_copy(update={"shards_dir": str(data_dir() / "shards" / name)})
    clips_dir = params.clips_dir
    for url in (clips_dir, params.shards_dir):  # a store without credentials: one line, first
        storage.check_access(url)
    if params.query:
        sub_dir = params.shards_dir.rstrip("/") + "/_query"
        subset = search_subset_task(clips_dir, params.query, params.query_top, sub_dir)
        print(f"{subset['n_clips']} clips match {params.query!r} -> {subset['clips']}")
        clips_dir = sub_dir
    summary = write_shards_task(
        clips_dir,
        params.shards_dir,
        target_shard_mb=params.target_shard_mb,
        text_model=params.text_model,
        text_mode=params.text_mode,
    )
    print(f"{summary['n_samples']} samples in {summary['n_shards']} shards -> {summary['index']}")
    emit_stage_completed(
        "shard",
        {
            "shards_dir": params.shards_dir,
            "index": summary["index"],
            "clips_dir": clips_dir,
            "n_samples": summary["n_samples"],
        },
    )
    return summary


if __name__ == "__main__":
    import sys

    from flows.entry import run_main

    run_main(
        lambda: shard_flow(ShardParams(clips_dir=sys.argv[1], shards_dir=sys.argv[2])),
        name="flows.shard",
    )
