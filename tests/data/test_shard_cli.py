"""``vfm shard CLIPS_DIR SHARDS_DIR``: from a curation output to shards a loader reads."""

from __future__ import annotations

import json

import pytest

from vfm_core.cli import main
from vfm_core.data.loader import build_loader


@pytest.mark.slow
def test_vfm_shard_then_load(clips_dir, tmp_path, capsys):
    out = tmp_path / "shards"
    assert main(["shard", str(clips_dir), str(out), "--target-shard-mb", "0.02", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["n_samples"] == 24 and summary["n_shards"] >= 3
    assert summary["embedding_dim"] == 384 and summary["images"] == 8
    b = build_loader(shards=str(out), seed=0, batch_size=3).next_batch()
    assert len(b.keys) == 3 and b.samples[0].txt_emb.shape == (1, 384)


def test_vfm_shard_errors(tmp_path, capsys):
    assert main(["shard", str(tmp_path / "nope"), str(tmp_path / "out")]) == 2
    assert "clips.parquet: cannot read the clips manifest" in capsys.readouterr().err
    assert main(["shard", str(tmp_path), str(tmp_path / "o"), "--target-shard-mb", "0"]) == 2
    assert "--target-shard-mb must be positive" in capsys.readouterr().err
