"""The same curation on s3:// against moto's S3-protocol server on loopback (s3fs, dummy keys)."""

from __future__ import annotations

import socket

import polars as pl
import pytest

from tests.curate.conftest import CFG, assert_covered
from vfm_core import storage
from vfm_core.contracts import Rejects, read_manifest
from vfm_core.curate import curate, discover
from vfm_core.curate.pipeline import read_clips
from vfm_core.video.io import probe

pytest.importorskip("s3fs")
moto_server = pytest.importorskip("moto.server")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def s3(monkeypatch):
    """A fresh moto server on 127.0.0.1 and a bucket; s3fs reaches it via AWS_ENDPOINT_URL."""
    import fsspec

    port = _free_port()
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=port)
    server.start()
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{port}")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    fsspec.filesystem("s3").clear_instance_cache()
    fs, _ = storage.filesystem("s3://vfm")
    fs.mkdir("vfm")
    yield fs
    fs.rm("vfm", recursive=True)  # moto's backend is process-global: leave no bucket behind
    fs.clear_instance_cache()
    server.stop()


@pytest.mark.slow
def test_curate_s3_to_s3(s3, good_dir, bad_dir, tmp_path):
    for p in good_dir[0].iterdir():
        s3.put_file(str(p), f"vfm/raw/{p.name}")
    for k in ("zero_byte", "rotated"):
        s3.put_file(str(bad_dir / f"{k}.mp4"), f"vfm/raw/bad/{k}.mp4")
    s3.put_file(str(bad_dir / "vfr.mp4"), "vfm/raw/bad/gone.mp4")
    refs = discover("s3://vfm/raw/")
    assert [r.source_uri for r in refs][:2] == [
        "s3://vfm/raw/bad/gone.mp4",
        "s3://vfm/raw/bad/rotated.mp4",
    ]
    s3.rm("vfm/raw/bad/gone.mp4")  # listed, then unreadable: a "read" reject, retried next run
    s3.invalidate_cache()
    out = curate("s3://vfm/raw/", "s3://vfm/out", config=CFG, refs=refs)
    clips = read_clips("s3://vfm/out")
    rejects = read_manifest("s3://vfm/out/rejects.parquet", Rejects)
    inputs = {r.source_uri for r in refs}
    assert set(clips["source_uri"]) | set(rejects["source_uri"]) == inputs
    assert out["n_clips"] == clips.height > 10
    assert_covered("s3://vfm/out")
    by_stage = dict(zip(rejects["source_uri"], rejects["stage"], strict=False))
    assert by_stage["s3://vfm/raw/bad/gone.mp4"] == "read"
    assert by_stage["s3://vfm/raw/bad/zero_byte.mp4"] == "probe"
    gone = rejects.filter(pl.col("stage") == "read")["reason"][0]
    assert "not found" in gone or "unreadable" in gone, gone
    # clips live on S3, are valid H.264 and carry their sidecar captions (read from S3)
    on_s3 = sorted(s3.ls("vfm/out/clips"))
    assert on_s3 == sorted(f"vfm/out/clips/{c}.mp4" for c in clips["clip_id"])
    first = clips.row(0, named=True)
    local = tmp_path / "c.mp4"
    s3.get_file(first["uri"].removeprefix("s3://"), str(local))
    assert probe(local).n_frames == first["n_frames"]
    demo0 = clips.filter(pl.col("source_uri") == "s3://vfm/raw/demo0.mp4")
    assert set(demo0["caption"]) == {"moving shapes over coloured textures"}
    # rerun: finished videos are skipped, the unreadable one is retried (and still rejected)
    again = curate("s3://vfm/raw/", "s3://vfm/out", config=CFG, refs=refs)
    assert again["n_skipped"] == len(refs) - 1 and again["n_clips"] == out["n_clips"]


@pytest.mark.slow
def test_s3_store_failure_fails_the_run(s3, good_dir):
    """A destination that cannot be written is not the input's fault: no reject, an error."""
    from vfm_core.storage import StorageError

    s3.put_file(str(good_dir[0] / "demo0.mp4"), "vfm/raw/demo0.mp4")
    with pytest.raises(StorageError, match="s3://no-such-bucket/out/clips/.*upload failed"):
        curate("s3://vfm/raw/", "s3://no-such-bucket/out", config=CFG)
