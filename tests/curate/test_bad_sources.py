"""Sources that must never stall `vfm curate`: a FIFO named like a video is refused unopened, and
a decode that runs past its timeout lands in the rejects with the reason (issue #27, case 3)."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from tests.curate.conftest import CFG, assert_covered
from vfm_core.contracts import Rejects, read_manifest
from vfm_core.curate import curate
from vfm_core.curate.pipeline import read_clips
from vfm_core.video import io as video_io
from vfm_core.video.synthetic import Segment, VideoSpec, make_video

pytestmark = pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs POSIX FIFOs")


@pytest.fixture(scope="module")
def tiny_video(tmp_path_factory) -> Path:
    """One 3 s shot at 64x48 (one clip with CFG's 1 s minimum)."""
    path = tmp_path_factory.mktemp("tiny") / "good.mp4"
    spec = VideoSpec(width=64, height=48, fps=8.0, segments=(Segment(kind="moving", n_frames=24),))
    make_video(path, spec)
    return path


def _curate_within(src: Path, dst: Path, seconds: float = 120.0) -> dict:
    """`curate` in a thread: a blocked open fails the test instead of hanging it."""
    out: dict = {}

    def work() -> None:
        try:
            out["result"] = curate(str(src), str(dst), config=CFG)
        except BaseException as e:  # noqa: BLE001 - re-raised below
            out["error"] = e

    t = threading.Thread(target=work, daemon=True)
    t.start()
    t.join(seconds)
    assert not t.is_alive(), f"curate did not finish within {seconds} s (blocked on an input?)"
    if "error" in out:
        raise out["error"]
    return out["result"]


def _rejects(dst: Path) -> dict[str, tuple[str, str]]:
    df = read_manifest(dst / "rejects.parquet", Rejects)
    return {Path(r["source_uri"]).name: (r["stage"], r["reason"]) for r in df.to_dicts()}


def test_fifo_named_like_a_video_is_rejected_unopened(tiny_video, tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    os.link(tiny_video, src / "good.mp4")
    os.mkfifo(src / "x.mp4")  # opening it would block until a writer comes: nobody does
    dst = tmp_path / "out"
    out = _curate_within(src, dst)
    assert out["n_inputs"] == 2 and out["n_clips"] >= 1
    stage, reason = _rejects(dst)["x.mp4"]
    assert stage == "probe" and "not a regular file (a named pipe (FIFO))" in reason
    assert {Path(u).name for u in read_clips(str(dst))["source_uri"]} == {"good.mp4"}
    assert_covered(dst)
    # the FIFO alone as SRC: one input, rejected the same way
    alone = _curate_within(src / "x.mp4", tmp_path / "alone")
    assert alone["n_inputs"] == 1 and alone["n_rejects"] == 1


class _FirstDecodeOnly:
    """A decode timeout that lets the first decode (the probe) through and no later one."""

    def __init__(self) -> None:
        self.calls = 0

    def seconds(self, media_s: float | None) -> float:
        self.calls += 1
        return 600.0 if self.calls == 1 else 0.0


def test_a_decode_past_its_timeout_is_a_reject_with_the_reason(tiny_video, tmp_path, monkeypatch):
    src = tmp_path / "src"
    src.mkdir()
    os.link(tiny_video, src / "slow.mp4")
    monkeypatch.setattr(
        video_io, "DECODE_TIMEOUT", video_io.DecodeTimeout(base_s=0.0, per_media_s=0.0)
    )
    out = _curate_within(src, tmp_path / "at-probe")
    assert out["n_clips"] == 0 and out["n_rejects"] == 1
    stage, reason = _rejects(tmp_path / "at-probe")["slow.mp4"]
    assert stage == "probe" and "decode exceeded its 0 s timeout" in reason
    # the probe passes, the shot splitter's full decode runs out of time
    monkeypatch.setattr(video_io, "DECODE_TIMEOUT", _FirstDecodeOnly())
    out = _curate_within(src, tmp_path / "at-split")
    stage, reason = _rejects(tmp_path / "at-split")["slow.mp4"]
    assert out["n_clips"] == 0 and stage == "split" and "decode exceeded its 0 s timeout" in reason
    assert_covered(tmp_path / "at-split")  # the whole probed video is the reject
