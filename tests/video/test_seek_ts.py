"""A range decoded from MPEG-TS (camcorder .mts / .m2ts, broadcast) has all its frames: TS seeks
by timestamp and lands inside a group of pictures, where the decoder drops frames up to the next
keyframe, so `iter_av_frames` seeks again further back (`io._decode_from`)."""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path

import av
import numpy as np
import pytest

from vfm_core.curate import CurateConfig, curate
from vfm_core.curate.pipeline import read_clips
from vfm_core.video.io import decode_frames, iter_av_frames
from vfm_core.video.synthetic import Segment, VideoSpec, make_video, render_frames

ALL = {"start_s": None, "end_s": None, "threads": "AUTO"}


def _remux(src: Path, dst: Path, fmt: str) -> Path:
    """`src`'s packets, unchanged, in a `fmt` container."""
    with av.open(str(src)) as c, av.open(str(dst), "w", format=fmt) as out:
        ins = list(c.streams)
        outs = {s.index: out.add_stream_from_template(s) for s in ins}
        for p in c.demux(*ins):
            if p.dts is None:
                continue
            p.stream = outs[p.stream.index]
            out.mux(p)
    return dst


@pytest.fixture(scope="module")
def ts_video(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("ts")
    spec = VideoSpec(width=96, height=64, fps=25.0, segments=(Segment(n_frames=100),) * 2)
    make_video(d / "v.mp4", spec)  # x264: keyframes at 0 and the cut (4 s) only
    return _remux(d / "v.mp4", d / "v.ts", "mpegts")


def _assert_ranges_are_the_whole_decode(path: Path, starts: tuple[float, ...], length: float):
    """Every [start, start + length) decoded alone: the frames of the whole decode whose centre
    is in it (half a frame at 25 fps), the same times and pixels."""
    whole = [(t, f.to_ndarray()) for t, f in iter_av_frames(path, **ALL)]
    for start in starts:
        end = start + length
        got = list(iter_av_frames(path, start_s=start, end_s=end, threads="AUTO"))
        want = [(t, a) for t, a in whole if start - 0.02 <= t < end - 0.02]
        assert [t for t, _ in got] == [t for t, _ in want], (path.name, start)
        for (_, f), (_, a) in zip(got, want, strict=True):  # no picture from missing references
            np.testing.assert_array_equal(f.to_ndarray(), a, err_msg=f"{path.name} {start}")


def test_every_range_of_a_ts_file_has_all_its_frames(ts_video):
    assert len(list(iter_av_frames(ts_video, **ALL))) == 200
    _assert_ranges_are_the_whole_decode(ts_video, (0.5, 1.3, 2.0, 3.96, 4.0, 5.5, 7.0), 1.0)


def test_a_ts_file_curates_to_the_clips_of_its_mp4(ts_video, tmp_path):
    """The same packets in MPEG-TS and in MP4: the same clips, frame for frame."""
    for fmt in ("mpegts", "mp4"):
        (tmp_path / fmt).mkdir()
        _remux(ts_video, tmp_path / fmt / f"v.{'ts' if fmt == 'mpegts' else 'mp4'}", fmt)
        curate(
            str(tmp_path / fmt), str(tmp_path / f"out_{fmt}"), config=CurateConfig(min_len_s=1.0)
        )
    ts, mp4 = (read_clips(str(tmp_path / f"out_{f}")).sort("start_s") for f in ("mpegts", "mp4"))
    assert ts.height == mp4.height == 2
    assert (
        ts.select("start_s", "end_s", "n_frames").rows()
        == mp4.select("start_s", "end_s", "n_frames").rows()
    )
    for a, b in zip(ts["uri"], mp4["uri"], strict=True):
        np.testing.assert_array_equal(decode_frames(a), decode_frames(b))


def test_open_gop_ranges_start_at_a_keyframe(tmp_path):
    """Open GOPs (x264 open-gop, broadcast): pictures shown before a keyframe reference the GOP
    before it. Every range, in TS and MP4, still has exactly the frames of a whole decode."""
    spec = VideoSpec(width=96, height=64, fps=25.0, segments=(Segment(n_frames=150),))
    frames = list(render_frames(spec)[0])
    for fmt in ("mpegts", "mp4"):
        path = tmp_path / f"open.{fmt}"
        with av.open(str(path), "w", format=fmt) as out:
            st = out.add_stream("libx264", rate=25)
            st.width, st.height, st.pix_fmt = 96, 64, "yuv420p"
            params = "open-gop=1:keyint=25:min-keyint=25:bframes=3:scenecut=0"
            st.options = {"crf": "23", "preset": "veryfast", "x264-params": params}
            for i, a in enumerate(frames):
                vf = av.VideoFrame.from_ndarray(a, format="rgb24").reformat(format="yuv420p")
                vf.pts, vf.time_base = i, Fraction(1, 25)
                out.mux(st.encode(vf))
            out.mux(st.encode(None))
        _assert_ranges_are_the_whole_decode(path, (0.3, 1.1, 2.5, 4.9), 0.8)
