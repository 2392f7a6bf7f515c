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
from vfm_core.data.index import DatasetIndexError, read_index
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


def test_index_schema_version_and_contents(tmp_path):
    dataset(tmp_path / "d")
    path = tmp_path / "d" / "index.json"
    doc = json.loads(path.read_text())
    path.write_text(json.dumps({**doc, "schema_version": 2}))
    with pytest.raises(DatasetIndexError, match="schema_version 2, this reader understands 1"):
        read_index(str(tmp_path / "d"))
    bad = {**doc, "shards": [{**doc["shards"][0], "n_samples": -1}]}
    path.write_text(json.dumps(bad))
    with pytest.raises(DatasetIndexError, match="fails its schema"):
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


def test_index_latent_shape_is_checked(tmp_path):
    dataset(tmp_path / "d")
    path = tmp_path / "d" / "index.json"
    doc = json.loads(path.read_text())
    doc["samples"][1]["latent_shape"] = [4, 2, "x"]
    path.write_text(json.dumps(doc))
    with pytest.raises(DatasetIndexError, match="latent_shape"):
        read_index(str(tmp_path / "d"))
