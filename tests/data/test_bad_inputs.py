"""Bad input, each a test: a clear error naming the input, or a counted, logged skip that never
shifts any rank's stream."""

from __future__ import annotations

import json
import logging
import threading
import time

import numpy as np
import pytest
from datagen import craft_dataset, good_members, npy

from vfm_core import storage
from vfm_core.data.index import read_index
from vfm_core.data.index_tables import DatasetIndexError
from vfm_core.data.loader import build_loader
from vfm_core.data.shards import SampleError, ShardError, read_range, verify_shards

MP4 = b"\x00\x00\x00\x18ftypmp42 not really a clip"
N = 8


def dataset(root, bad: dict[int, list[tuple[str, bytes]]] | None = None):
    samples = {f"k{i}": good_members(f"k{i}", MP4) for i in range(N)}
    for i, members in (bad or {}).items():
        samples[f"k{i}"] = members
    return craft_dataset(root, samples)


def run(root, *, dp_rank=0, dp_size=1, steps=2, on_error="skip", decode="none"):
    ld = build_loader(
        shards=str(root),
        seed=0,
        dp_rank=dp_rank,
        dp_size=dp_size,
        batch_size=2,
        decode=decode,
        on_error=on_error,
    )
    return ld, [ld.next_batch() for _ in range(steps)]


def bad_sample_case(tmp_path, members, match, caplog):
    """The bad sample is skipped (counted, logged) and nobody's stream moves; 'raise' names it."""
    clean = dataset(tmp_path / "clean")
    root = tmp_path / "bad"
    dataset(root, {3: members})
    seen = 0
    for rank in range(2):
        _, want = run(clean.root, dp_rank=rank, dp_size=2, steps=4)
        with caplog.at_level(logging.WARNING, logger="vfm_core.data.loader"):
            ld, got = run(root, dp_rank=rank, dp_size=2, steps=4)
        want_keys = [k for b in want for k in b.keys if k != "k3"]
        assert [k for b in got for k in b.keys] == want_keys  # same stream minus the bad sample
        assert [b.step for b in got] == [1, 2, 3, 4]
        hits = [k for b in want for k in b.keys].count("k3")  # k3 on this rank, any epoch
        assert ld.skipped_total == hits
        assert sum("k3" in s for b in got for s in b.skipped) == hits
        if hits:
            assert any("k3" in r.getMessage() for r in caplog.records)
        seen += hits
    assert seen > 0  # the bad sample was in somebody's stream
    with pytest.raises(SampleError, match=match):
        run(root, steps=N // 2, on_error="raise")


def test_missing_member(tmp_path, caplog):
    members = [m for m in good_members("k3", MP4) if not m[0].endswith(".txt_emb.npy")]
    bad_sample_case(tmp_path, members, r"sample k3: missing member\(s\) k3.txt_emb.npy", caplog)


@pytest.mark.parametrize("name", ["../k3.json", "/k3.json", "k3/../../k3.json"])
def test_unsafe_member_names(tmp_path, caplog, name):
    members = [(name, b"{}")] + good_members("k3", MP4)[1:]
    bad_sample_case(tmp_path, members, r"unsafe member name", caplog)


@pytest.mark.parametrize(
    ("emb", "match"),
    [
        (np.zeros((1, 16), np.float64), "dtype float64, expected float32"),
        (np.zeros((1, 8), np.float32), r"shape \(1, 8\), expected \(L, 16\)"),
        (np.zeros(16, np.float32), r"shape \(16,\), expected \(L, 16\)"),
        (np.full((1, 16), np.nan, np.float32), "contains NaN or inf"),
    ],
    ids=["dtype", "shape", "1d", "nan"],
)
def test_bad_embedding(tmp_path, caplog, emb, match):
    members = good_members("k3", MP4)[:2] + [("k3.txt_emb.npy", npy(emb))]
    bad_sample_case(tmp_path, members, match, caplog)


def test_pickled_npy_is_refused(tmp_path, caplog):
    import io

    buf = io.BytesIO()
    np.save(buf, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    members = good_members("k3", MP4)[:2] + [("k3.txt_emb.npy", buf.getvalue())]
    bad_sample_case(tmp_path, members, "not a plain numeric .npy", caplog)


def test_undecodable_clip_is_skipped(tmp_path, caplog):
    ld, got = run(dataset(tmp_path / "d").root, steps=N // 2, decode="frames")
    assert ld.skipped_total == N and all(b.keys == [] for b in got)
    with pytest.raises(SampleError, match="clip does not decode"):
        run(tmp_path / "d", decode="frames", on_error="raise")


def test_truncated_tar(tmp_path):
    index = dataset(tmp_path / "d")
    shard = tmp_path / "d" / "shard-000000.tar"
    data = shard.read_bytes()
    last = index.samples.iloc[-1]
    shard.write_bytes(data[: int(last["offset"]) + 700])  # cut inside the last sample
    with pytest.raises(ShardError, match=r"shard-000000.tar: size \d+ bytes, index says \d+"):
        build_loader(shards=str(tmp_path / "d"))
    ld = build_loader(shards=str(tmp_path / "d"), verify="none", decode="none", batch_size=N)
    with pytest.raises(ShardError, match="shard-000000.tar: truncated: wanted bytes"):
        ld.next_batch()


def test_checksum_mismatch(tmp_path):
    dataset(tmp_path / "d")
    shard = tmp_path / "d" / "shard-000000.tar"
    data = bytearray(shard.read_bytes())
    data[600] ^= 0xFF  # same size, one byte flipped
    shard.write_bytes(bytes(data))
    build_loader(shards=str(tmp_path / "d"), verify="size")  # size still matches
    with pytest.raises(ShardError, match="sha256 checksum does not match the index"):
        build_loader(shards=str(tmp_path / "d"), verify="sha256")
    with pytest.raises(ShardError, match="sha256 checksum does not match the index"):
        build_loader(shards=str(tmp_path / "d"))  # default: no per-sample checksums -> sha256


def test_index_schema_version_and_contents(tmp_path):
    dataset(tmp_path / "d")
    path = tmp_path / "d" / "index.json"
    doc = json.loads(path.read_text())
    path.write_text(json.dumps({**doc, "schema_version": 2}))
    with pytest.raises(DatasetIndexError, match="schema_version 2, this reader understands 1"):
        read_index(str(tmp_path / "d"))
    bad = {**doc, "shards": [{**doc["shards"][0], "n_samples": -1}]}
    path.write_text(json.dumps(bad))
    with pytest.raises(DatasetIndexError, match="fails its schema") as e:
        read_index(str(tmp_path / "d"))
    assert str(e.value) == (
        f"{path}: index fails its schema: shards column 'n_samples' fails greater_than(0) "
        "with '-1' at row 0"
    )
    # one line: the first failure and how many there are; an empty index says so
    bad = {**doc, "samples": doc["samples"] + [doc["samples"][0], doc["samples"][1]]}
    path.write_text(json.dumps(bad))
    with pytest.raises(DatasetIndexError) as e:
        read_index(str(tmp_path / "d"))
    assert "\n" not in str(e.value)
    assert "samples column 'key' fails field_uniqueness with 'k0' at row 0 (4 failures" in str(
        e.value
    )
    path.write_text(json.dumps({**doc, "samples": [], "n_samples": 0}))
    with pytest.raises(DatasetIndexError, match=r"index.json: no samples \(the index lists none\)"):
        read_index(str(tmp_path / "d"))
    path.write_text("{not json")
    with pytest.raises(DatasetIndexError, match="not valid JSON"):
        read_index(str(tmp_path / "d"))
    path.unlink()
    with pytest.raises(DatasetIndexError, match="cannot read the dataset index"):
        read_index(str(tmp_path / "d"))


def test_missing_shard(tmp_path):
    dataset(tmp_path / "d")
    (tmp_path / "d" / "shard-000000.tar").unlink()
    with pytest.raises(ShardError, match="shard listed in the index is missing"):
        verify_shards(read_index(str(tmp_path / "d")))


def test_too_long_samples_are_skipped_for_every_rank(shard_dir):
    lds = [
        build_loader(
            shards=str(shard_dir), seed=0, dp_rank=r, dp_size=2, max_tokens=17, decode="none"
        )
        for r in range(2)
    ]
    for _ in range(4):
        for ld in lds:
            b = ld.next_batch()
            assert all(p.n_tokens <= 17 for p in b.packs)
    assert lds[0].planner.state.n_skipped == lds[1].planner.state.n_skipped > 0
    with pytest.raises(ValueError, match="no sample of the dataset fits"):
        build_loader(shards=str(shard_dir), max_tokens=2)


@pytest.mark.slow
def test_s3_transient_errors_retried_then_clear(s3_server, tmp_path, monkeypatch):
    import s3fs

    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")  # our retry loop, not botocore's, is under test
    s3fs.S3FileSystem.clear_instance_cache()
    local = dataset(tmp_path / "d")
    url = "s3://vfm/bad-inputs"
    for name in ("shard-000000.tar", "index.json"):
        storage.put_file(tmp_path / "d" / name, f"{url}/{name}")
    shard, row = f"{url}/shard-000000.tar", local.samples.iloc[2]
    want = (tmp_path / "d" / "shard-000000.tar").read_bytes()
    span = (int(row["offset"]), int(row["length"]))
    server = s3_server["server"]
    server.stop()  # outage: the server comes back while we retry
    restart = threading.Timer(0.5, server.start)
    restart.start()
    t0 = time.perf_counter()
    got = read_range(shard, *span, retries=6, backoff=0.1)
    restart.join()
    assert got == want[span[0] : span[0] + span[1]] and time.perf_counter() - t0 >= 0.4
    server.stop()  # a longer outage: a few retries, then a clear error naming the shard
    try:
        with pytest.raises(ShardError, match=r"shard-000000.tar: read of bytes .* failed after 3"):
            read_range(shard, *span, retries=2, backoff=0.05)
    finally:
        server.start()
        s3fs.S3FileSystem.clear_instance_cache()  # no client of 1 attempt left for later tests


def test_index_latent_shape_is_checked(tmp_path):
    dataset(tmp_path / "d")
    path = tmp_path / "d" / "index.json"
    doc = json.loads(path.read_text())
    doc["samples"][1]["latent_shape"] = [4, 2, "x"]
    path.write_text(json.dumps(doc))
    with pytest.raises(DatasetIndexError, match="latent_shape"):
        read_index(str(tmp_path / "d"))


# ------------------------------------------------------------------ integrity (issue #27)
SMALL = [
    "data.latent_frames=2",
    "data.latent_height=4",
    "data.latent_width=4",
    "data.batch_size=2",
    "model.text_dim=16",
    "tracking.mlflow=false",
]


def shard_config(shards, *extra):
    from vfm_core.config import apply_overrides
    from vfm_core.recipes import get_recipe

    return apply_overrides(
        get_recipe("dit-tiny"), ["data.source=shards", f"data.shards={shards}", *extra]
    )


def write_real(clips_dir, out, *, n=None, **kw):
    """Shards of real clips through the writer (per-sample checksums in the index)."""
    import pandas as pd
    from datagen import hash_embed

    from vfm_core.data.shards import write_shards

    df = pd.read_parquet(clips_dir / "clips.parquet")
    df = df if n is None else df.head(n)
    return write_shards(df, str(out), embed=hash_embed, base_url=str(clips_dir), **kw)


def member(root, index, key: str, ext: str) -> tuple[object, int, int]:
    """(shard path, offset, size) of member ``{key}.{ext}``'s data inside its shard."""
    import tarfile

    row = index.samples.set_index("key").loc[key]
    path = root / str(index.shards.at[int(row["shard"]), "name"])
    with tarfile.open(path) as tar:
        m = tar.getmember(f"{key}.{ext}")
        return path, m.offset_data, m.size


def patch(path, offset: int, data: bytes) -> None:
    """Overwrite bytes in place: the file keeps its size."""
    buf = bytearray(path.read_bytes())
    buf[offset : offset + len(data)] = data
    path.write_bytes(bytes(buf))


def flip(path, offset: int, n: int = 1, mask: int = 0xFF) -> None:
    """XOR ``n`` bytes from ``offset`` with ``mask`` (always a change, same size)."""
    old = path.read_bytes()[offset : offset + n]
    patch(path, offset, bytes(b ^ mask for b in old))


def damage_mp4(path, offset: int, size: int) -> None:
    """Zero the clip's media data from 30% on (same size): its first frame still decodes (a probe
    passes), the rest does not."""
    clip = path.read_bytes()[offset : offset + size]
    mdat = clip.find(b"mdat") + 4
    cut = mdat + (size - mdat) * 3 // 10
    patch(path, offset + cut, bytes(size - cut))


def epoch_keys(root, **kw):
    """One epoch, one sample a step: (loader, keys delivered, skip reasons)."""
    ld = build_loader(shards=str(root), seed=0, batch_size=1, **kw)
    got = [ld.next_batch() for _ in range(len(ld.index))]
    return ld, [k for b in got for k in b.keys], [r for b in got for r in b.skip_reasons]


@pytest.mark.parametrize("index_format", ["json", "parquet"])
def test_flipped_bytes_in_any_member_are_skipped_and_named(clips_dir, tmp_path, index_format):
    """Cases 5 and 6: the caption embedding still finite, the clip still decoding (to garbage):
    only the per-sample checksum tells; the sample is skipped, its shard and key named."""
    root = tmp_path / "d"
    index = write_real(clips_dir, root, n=8, index_format=index_format)
    assert index.checksummed and read_index(str(root)).checksummed
    keys = list(index.samples["key"])
    emb_key, mp4_key = keys[2], keys[5]
    path, off, size = member(root, index, emb_key, "txt_emb.npy")
    flip(path, off + size - 2, mask=0x01)  # the last float16's lowest bit: still finite
    path, off, size = member(root, index, mp4_key, "mp4")
    flip(path, off + size // 2, 32, mask=0x5A)  # inside the clip's media data
    ld, got, reasons = epoch_keys(root, decode="frames")
    assert sorted(got) == sorted(set(keys) - {emb_key, mp4_key}) and ld.skipped_total == 2
    for key in (emb_key, mp4_key):
        (why,) = [r for r in reasons if f" sample {key}:" in r]
        assert str(path) in why and "checksum mismatch" in why
    # without the check the embedding is read as if nothing happened (no NaN to catch)
    ld, got, _ = epoch_keys(root, decode="none", verify="size")
    assert emb_key in got and ld.skipped_total == 0


def test_damaged_clip_never_reaches_the_tokenizer(clips_dir, tmp_path):
    """Case 4: bytes of one clip flipped (same size) while training through data.tokenizer: the
    sample is skipped and named (checksum), and with checksums off the decoded clip is checked
    against the frames it must give, instead of a TokenizerShapeError from inside the model."""
    import torch

    from vfm_core.data.buckets import BucketSpec
    from vfm_core.data.shard_source import ShardLatentSource
    from vfm_core.tokenizer import CausalVideoAutoencoder, get_tokenizer_config, save_tokenizer

    root = tmp_path / "d"
    index = write_real(clips_dir, root, n=12)
    key = "clip000001"  # 9 frames of 32x48: in the training shape (5 frames of 32x32)
    damage_mp4(*member(root, index, key, "mp4"))
    torch.manual_seed(0)
    tok = CausalVideoAutoencoder(get_tokenizer_config("tok-tiny"))
    save_tokenizer(tok, tmp_path / "tok")
    cfg = shard_config(root, *SMALL, f"data.tokenizer={tmp_path / 'tok'}")
    src = ShardLatentSource(cfg.data, cfg.model, tokenizer=tok)
    seen = [k for _ in range(5) for k in src.next_batch().keys]  # > 1 epoch of the shape
    assert key not in seen and src.loader.skipped_total >= 1
    shape = BucketSpec(resolutions=((32, 32),), durations=(5,))
    ld = build_loader(
        shards=str(root), seed=0, batch_size=8, buckets=shape, decode="frames", verify="size"
    )
    batch = ld.next_batch()
    (why,) = batch.skip_reasons
    assert f"sample {key}: clip decodes to 1 of its 9 frames (damaged), 5 are needed" in why
    assert str(root / "shard-000000.tar") in why


def test_edited_shard_sha256_in_the_index_is_noticed(clips_dir, tmp_path, caplog):
    """Case 7: a shard's sha256 edited in index.json: one warning, then every shard's sha256 is
    checked before the data is trusted (that shard fails, named); other edits are one warning."""
    root = tmp_path / "d"
    write_real(clips_dir, root, n=6)
    path = root / "index.json"
    doc = json.loads(path.read_text())
    doc["shards"][0]["sha256"] = "0" * 64
    path.write_text(json.dumps(doc))
    with caplog.at_level(logging.WARNING, logger="vfm_core.data.index"):
        with pytest.raises(ShardError, match=r"shard-000000.tar: sha256 checksum does not match"):
            build_loader(shards=str(root))
    assert "the shard table was edited after the index was written" in caplog.text
    caplog.clear()
    write_real(clips_dir, root, n=6)  # intact again
    doc = json.loads(path.read_text())
    doc["meta"]["note"] = "edited by hand"
    path.write_text(json.dumps(doc))
    with caplog.at_level(logging.WARNING, logger="vfm_core.data.index"):
        ld = build_loader(shards=str(root), decode="none")
    assert ld.index.integrity == "edited" and "edited after it was written" in caplog.text
    assert ld.next_batch().keys


def test_old_index_without_checksums_loads_and_says_so_once(tmp_path, caplog):
    """An index written before per-sample checksums: loads, falls back to every shard's sha256
    (a small dataset), one warning per dataset; a flipped byte then fails the shard, named."""
    dataset(tmp_path / "d")
    with caplog.at_level(logging.WARNING, logger="vfm_core.data.loader"):
        ld = build_loader(shards=str(tmp_path / "d"), decode="none", batch_size=2)
        build_loader(shards=str(tmp_path / "d"), decode="none", batch_size=2)
    assert not ld.index.checksummed and ld.index.integrity == "sealed"
    lines = [r.getMessage() for r in caplog.records if "no per-sample checksums" in r.getMessage()]
    assert len(lines) == 1 and "checking every shard's sha256 now" in lines[0]
    assert len(ld.next_batch().keys) == 2
    flip(tmp_path / "d" / "shard-000000.tar", 600)
    with pytest.raises(ShardError, match="shard-000000.tar: sha256 checksum does not match"):
        build_loader(shards=str(tmp_path / "d"))


def test_every_sample_bad_is_one_line_naming_the_dataset(clips_dir, tmp_path):
    """Case 9: every sample of a step bad -> one line: the dataset, how many, the first reasons."""
    import pandas as pd

    from vfm_core.data.shard_source import ShardLatentSource
    from vfm_core.errors import UserError

    rng = np.random.default_rng(0)
    ids = pd.read_parquet(clips_dir / "clips.parquet")["clip_id"].head(6)
    lat = {c: rng.standard_normal((4, 3, 6, 6)).astype(np.float32) for c in ids}
    root = tmp_path / "d"
    index = write_real(clips_dir, root, n=6, latents=lat)
    for key in index.samples["key"]:
        path, off, size = member(root, index, key, "latent.npy")
        flip(path, off + size - 1, mask=0x01)  # still a finite float32
    cfg = shard_config(root, *SMALL)
    src = ShardLatentSource(cfg.data, cfg.model)
    with pytest.raises(ShardError) as e:
        src.next_batch()
    msg = str(e.value)
    assert isinstance(e.value, UserError) and "\n" not in msg
    assert msg.startswith(f"{root}: all 2 samples of step 1 were bad (2 bad samples read so far)")
    assert msg.count("checksum mismatch") == 2 and "shard-000000.tar sample clip" in msg


def test_clips_smaller_than_the_crop_name_the_sizes_and_keys(shard_dir):
    """Case 10: no clip is as large as the default latent crop: one line with the sizes and the
    data.latent_* keys (and values) to change."""
    from vfm_core.config import ConfigError
    from vfm_core.data.shard_source import ShardLatentSource

    cfg = shard_config(shard_dir, "model.text_dim=16")  # the default crop: 13 frames of 128x128
    with pytest.raises(ConfigError) as e:
        ShardLatentSource(cfg.data, cfg.model)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(f"{shard_dir}: every clip is smaller than")
    assert "the training crop of 13 frames of 128x128 px" in msg
    assert "the largest is 9 frames of 48x48 px" in msg
    assert "set data.latent_frames<=3, data.latent_height<=6, data.latent_width<=6" in msg


def test_vfm_index_test_decodes_and_checksums_foreign_samples(tmp_path):
    """Case 8: foreign tars with a clip that decodes only in part: skipped, counted and named by
    the index (its probe alone passes); the indexed samples carry checksums over both ranges."""
    wds = pytest.importorskip("webdataset")
    from datagen import hash_embed

    from vfm_core.data.foreign_index import index_foreign_shards
    from vfm_core.data.foreign_scan import ForeignIndexConfig
    from vfm_core.video.synthetic import Segment, VideoSpec, make_video

    clips = []
    for i in range(4):
        p = tmp_path / f"v{i}.mp4"
        spec = VideoSpec(width=32, height=32, fps=8.0, seed=i, segments=(Segment(n_frames=9),))
        make_video(p, spec)
        clips.append(p.read_bytes())
    bad = bytearray(clips[3])
    mdat = bad.find(b"mdat") + 4
    cut = mdat + (len(bad) - mdat) * 3 // 10
    bad[cut:] = bytes(len(bad) - cut)
    clips[3] = bytes(bad)
    root = tmp_path / "wds"
    root.mkdir()
    with wds.TarWriter(str(root / "data-000000.tar")) as w:
        for i, mp4 in enumerate(clips):
            w.write({"__key__": f"s{i}", "mp4": mp4, "txt": f"caption {i}".encode()})
    quick = index_foreign_shards(
        str(root), embed=hash_embed, config=ForeignIndexConfig(decode_check="first")
    )
    assert quick["n_skipped"] == 0  # the first frame decodes: what `vfm index` did before
    summary = index_foreign_shards(str(root), embed=hash_embed)
    assert summary["n_samples"] == 3 and summary["n_skipped"] == 1
    assert summary["skipped"] == {"media decodes only in part (damaged)": 1}
    assert summary["skipped_examples"] == [
        "data-000000.tar s3: media decodes only in part (damaged) (1 of its 9 frames decode)"
    ]
    index = read_index(str(root))
    assert index.checksummed
    # flipped bytes after indexing, in the foreign tar or in the sidecar: skipped, named
    path, off, size = member(root, index, "s1", "mp4")
    flip(path, off + size // 2, 8)
    row = index.samples.set_index("key").loc["s2"]
    flip(root / "_vfm" / "emb-000000.tar", int(row["emb_offset"]) + 700, mask=0x01)
    ld, got, reasons = epoch_keys(root, decode="frames")
    assert sorted(got) == ["s0"] and len(reasons) == 2
    assert all("checksum mismatch" in r for r in reasons)
