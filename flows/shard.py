"""Shard flow: curation output directory -> WebDataset shards + dataset index.

Thin by design: parameters are a pydantic model (rendered as a form in the Prefect UI), the work
is one task. Never imports torch.
"""

from __future__ import annotations

from typing import Any

from prefect import flow
from pydantic import BaseModel, Field

from tasks.shard import write_shards_task


class ShardParams(BaseModel):
    """Form of the shard flow."""

    clips_dir: str = Field(..., description="curation output dir with clips.parquet (local/s3://)")
    shards_dir: str = Field(..., description="destination of shards + index.json (local/s3://)")
    target_shard_mb: float = Field(64.0, gt=0, description="target shard size in MB")
    text_model: str | None = Field(None, description="caption encoder path (None = MiniLM-L6)")


@flow(name="shard", log_prints=True)
def shard_flow(params: ShardParams) -> dict[str, Any]:
    summary = write_shards_task(
        params.clips_dir,
        params.shards_dir,
        target_shard_mb=params.target_shard_mb,
        text_model=params.text_model,
    )
    print(f"{summary['n_samples']} samples in {summary['n_shards']} shards -> {summary['index']}")
    return summary


if __name__ == "__main__":
    import sys

    shard_flow(ShardParams(clips_dir=sys.argv[1], shards_dir=sys.argv[2]))
