"""``vfm shard CLIPS_DIR SHARDS_DIR``: from a curation output to shards a loader reads."""

from __future__ import annotations

import json

import numpy as np
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
    loader = build_loader(shards=str(out), seed=0, batch_size=3)
    b = loader.next_batch()
    assert len(b.keys) == 3
    # per-token caption embeddings ([CLS] words [SEP]), each token unit norm, length-trimmed
    lengths = {s.txt_emb.shape[0] for s in b.samples}
    assert all(s.txt_emb.shape[1] == 384 for s in b.samples) and min(lengths) >= 3
    for s in b.samples:
        assert s.txt_emb.shape[0] == len(s.meta["caption"].split()) + 2 or "-" in s.meta["caption"]
        np.testing.assert_allclose(np.linalg.norm(s.txt_emb, axis=1), 1.0, atol=2e-3)
    record = loader.index.meta["text"]
    assert record["mode"] == "tokens" and record["dim"] == 384 and record["kind"] != "t5"
    assert np.asarray(record["null"]).shape == (2, 384)  # the empty caption: [CLS] [SEP]

    pooled = tmp_path / "pooled"
    assert main(["shard", str(clips_dir), str(pooled), "--text-mode", "pooled", "--json"]) == 0
    b = build_loader(shards=str(pooled), seed=0, batch_size=3).next_batch()
    assert {s.txt_emb.shape for s in b.samples} == {(1, 384)}


def test_vfm_shard_errors(tmp_path, capsys):
    assert main(["shard", str(tmp_path / "nope"), str(tmp_path / "out")]) == 2
    assert "clips.parquet: cannot read the clips manifest" in capsys.readouterr().err
    assert main(["shard", str(tmp_path), str(tmp_path / "o"), "--target-shard-mb", "0"]) == 2
    assert "--target-shard-mb must be positive" in capsys.readouterr().err


@pytest.mark.slow
def test_real_curation_output_to_shards_to_loader(tmp_path, capsys):
    """vfm curate -> vfm shard -> loader: curation's clips.parquet (with its list-valued
    embedding column) is sharded as is."""
    from vfm_core.video.synthetic import demo_spec, make_video

    (tmp_path / "raw").mkdir()
    make_video(tmp_path / "raw" / "demo.mp4", demo_spec())
    assert main(["curate", str(tmp_path / "raw"), str(tmp_path / "cur"), "--json"]) == 0
    n_clips = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["n_clips"]
    assert main(["shard", str(tmp_path / "cur"), str(tmp_path / "sh"), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["n_samples"] == n_clips > 0
    ld = build_loader(shards=str(tmp_path / "sh"), seed=0, batch_size=2)
    s = ld.next_batch().samples[0]
    assert s.frames.shape == (s.meta["n_frames"], s.meta["height"], s.meta["width"], 3)
    assert s.meta["source_uri"].endswith("demo.mp4") and s.meta["end_s"] > s.meta["start_s"]
