"""Sharding says how far it is: progress lines through logging (the Prefect run log and the
``vfm`` command's stderr both show them)."""

from __future__ import annotations

import logging

import pandas as pd
from datagen import hash_embed

from vfm_core.data.shards import ShardWriterConfig, write_shards


def test_write_shards_logs_progress(clips_dir, tmp_path, caplog, monkeypatch):
    monkeypatch.setenv("VFM_PROGRESS_EVERY_S", "0")  # every unit "late enough" for a line
    caplog.set_level(logging.INFO, logger="vfm_core")
    df = pd.read_parquet(clips_dir / "clips.parquet")
    config = ShardWriterConfig(target_shard_bytes=20_000, embed_batch=8)
    write_shards(df, str(tmp_path / "s"), embed=hash_embed, base_url=str(clips_dir), config=config)
    lines = [r.getMessage() for r in caplog.records if r.name == "vfm_core.data.shards"]
    written = [ln for ln in lines if ln.startswith("writing shards: ")]
    assert len(written) == 24, lines
    assert written[-1].startswith("writing shards: 24/24 clips (100%), ")
    assert written[-1].endswith(" left") and " clip/s" in written[-1]
    embedded = [ln for ln in lines if ln.startswith("embedding captions: ")]
    assert embedded[-1].startswith("embedding captions: 24/24 captions (100%)")
    assert len(embedded) == 3  # one per batch of 8


def test_write_shards_logs_at_most_every_few_seconds(clips_dir, tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="vfm_core")
    df = pd.read_parquet(clips_dir / "clips.parquet")
    write_shards(df, str(tmp_path / "s"), embed=hash_embed, base_url=str(clips_dir))
    lines = [r.getMessage() for r in caplog.records if "writing shards" in r.getMessage()]
    assert lines and lines[-1].startswith("writing shards: 24/24 clips (100%)")
    assert len(lines) <= 2  # a second of work: the end line (and at most one on the way)
