"""``vfm shard CLIPS_DIR SHARDS_DIR``: from a curation output to shards a loader reads."""

from __future__ import annotations

import json

import numpy as np
import pytest

from vfm_core.cli import main
from vfm_core.data.index import read_index
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


def test_vfm_shard_errors(clips_dir, tmp_path, capsys):
    assert main(["shard", str(tmp_path / "nope"), str(tmp_path / "out")]) == 2
    assert "clips.parquet: cannot read the clips manifest" in capsys.readouterr().err
    for value, why in [("0", "must be > 0"), ("nan", "finite"), ("inf", "finite")]:
        with pytest.raises(SystemExit) as e:  # argparse: one line, exit 2
            main(["shard", str(tmp_path), str(tmp_path / "o"), "--target-shard-mb", value])
        assert e.value.code == 2
        err = capsys.readouterr().err
        assert "--target-shard-mb must" in err and why in err
    with pytest.raises(SystemExit):
        main(["index", str(tmp_path), "--sidecar-shard-mb", "inf"])
    assert "--sidecar-shard-mb must be a finite number, got 'inf'" in capsys.readouterr().err

    # a file where a directory goes: one line naming it, before any caption is embedded
    afile = tmp_path / "afile"
    afile.write_text("not a directory")
    assert main(["shard", str(clips_dir), str(afile)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"vfm shard: error: {afile}: SHARDS_DIR is not a directory but a file"
    assert main(["shard", str(afile), str(tmp_path / "out")]) == 2
    assert f"{afile}: CLIPS_DIR is not a directory but a file" in capsys.readouterr().err
    # a `vfm index` dataset (foreign tars) is never sharded over
    byo = tmp_path / "byo"
    byo.mkdir()
    (byo / "index.json").write_text(json.dumps({"meta": {"writer": "vfm_core.data.foreign_index"}}))
    assert main(["shard", str(clips_dir), str(byo)]) == 2
    assert "holds a dataset indexed by `vfm index`" in capsys.readouterr().err


@pytest.mark.slow
def test_vfm_shard_leaves_out_bad_clips_and_removes_stale_shards(clips_dir, tmp_path, capsys):
    """A clip file that does not decode is left out and named (summary + index meta); a rerun
    with bigger shards removes the shards of the first run that its index does not list."""
    import shutil

    import pandas as pd

    src = tmp_path / "cur"
    (src / "clips").mkdir(parents=True)
    df = pd.read_parquet(clips_dir / "clips.parquet").iloc[[1, 2, 4, 5]]
    for uri in df["uri"]:
        shutil.copy(clips_dir / uri, src / uri)
    df.to_parquet(src / "clips.parquet")
    bad = df["clip_id"].iloc[1]
    (src / "clips" / f"{bad}.mp4").write_bytes(b"\x00garbage" * 30)

    out = tmp_path / "sh"
    assert main(["shard", str(src), str(out), "--target-shard-mb", "0.000001"]) == 0
    err = capsys.readouterr().err
    assert f"1 clips left out (listed in the index meta 'rejected'), e.g. {bad} (" in err
    assert "clip does not decode" in err
    index = read_index(str(out))
    assert len(index) == 3 and bad not in set(index.samples["key"])
    assert [r["clip_id"] for r in index.meta["rejected"]] == [bad]
    assert sorted(p.name for p in out.glob("shard-*.tar")) == [
        f"shard-00000{i}.tar" for i in range(3)
    ]

    (out / "notes.tar").write_bytes(b"mine")  # not a name vfm writes: kept
    assert main(["shard", str(src), str(out), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["n_shards"] == 1 and summary["stale_shards_removed"] == [
        "shard-000001.tar",
        "shard-000002.tar",
    ]
    assert sorted(p.name for p in out.glob("*.tar")) == ["notes.tar", "shard-000000.tar"]
    assert len(build_loader(shards=str(out), seed=0).index) == 3


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


def test_vfm_shard_on_a_full_disk_is_one_line_and_leaves_no_partial_output(
    clips_dir, small_disk, capsys
):
    """A real full disk (a tmpfs of 40 kB): one line naming the folder, the files this run wrote
    removed, what was there before kept; after space is freed the same command completes."""
    mnt, resize = small_disk
    resize("40k")
    out = mnt / "shards"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    assert main(["shard", str(clips_dir), str(out), "--target-shard-mb", "0.02"]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith(f"vfm shard: error: {out}: the disk is full (No space left on device)")
    assert "files this run wrote" in err and "are removed" in err
    assert sorted(p.name for p in out.rglob("*")) == ["notes.txt"]
    resize("4M")
    assert main(["shard", str(clips_dir), str(out), "--target-shard-mb", "0.02", "--json"]) == 0
    assert len(read_index(str(out))) == 24
