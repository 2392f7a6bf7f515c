"""Interlaced sources become progressive clips (`video.deinterlace` inside `transcode_span`)."""

from __future__ import annotations

from pathlib import Path

import av
import numpy as np
import pytest

from vfm_core.video.transcode import transcode_span

W, H, N = 160, 96, 50


def _scene(t: int) -> np.ndarray:
    """(H, W, 3) a bright bar moving 2.5 px a field over a dark background."""
    a = np.full((H, W, 3), 40, np.uint8)
    x = int(10 + 2.5 * t)
    a[20:76, x : x + 12] = (230, 200, 60)
    return a


def _comb(frame: av.VideoFrame) -> float:
    """Mean |y[i] - (y[i-1] + y[i+1]) / 2|: high where lines of two moments alternate."""
    y = frame.to_ndarray(format="gray").astype(np.float32)
    return float(np.abs(y[1:-1] - 0.5 * (y[:-2] + y[2:])).mean())


@pytest.fixture(scope="module")
def interlaced(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """25 fps interlaced H.264 (top field first): each frame weaves two fields 1/50 s apart."""
    path = tmp_path_factory.mktemp("interlaced") / "i.mp4"
    with av.open(str(path), "w") as out:
        st = out.add_stream("libx264", rate=25)
        st.width, st.height, st.pix_fmt = W, H, "yuv420p"
        st.options = {"crf": "18", "preset": "ultrafast", "x264-params": "interlaced=1:tff=1"}
        for i in range(N):
            woven = _scene(2 * i)
            woven[1::2] = _scene(2 * i + 1)[1::2]  # the bottom field, half a frame later
            vf = av.VideoFrame.from_ndarray(woven, format="rgb24").reformat(format="yuv420p")
            vf.pts = i
            out.mux(st.encode(vf))
        out.mux(st.encode(None))
    return path


def test_interlaced_source_gives_a_progressive_clip(interlaced, tmp_path):
    with av.open(str(interlaced)) as c:
        src = list(c.decode(video=0))
    assert all(f.interlaced_frame for f in src)
    r = transcode_span(interlaced, tmp_path / "c.mp4", 0.4, 1.6, preset="ultrafast")
    assert r.deinterlaced and r.n_frames == 30  # one picture per frame, none lost at the end
    with av.open(str(tmp_path / "c.mp4")) as c:
        clip = list(c.decode(video=0))
    assert len(clip) == 30 and not any(f.interlaced_frame for f in clip)
    before = np.mean([_comb(f) for f in src[10:40]])
    after = np.mean([_comb(f) for f in clip])
    assert after < 0.2 * before, (before, after)
    # the bar is where its frame shows it: each clip frame matches its source frame's top field
    for i in (0, 15, 29):
        top = src[10 + i].to_ndarray(format="gray")[0::2].astype(np.float32)
        got = clip[i].to_ndarray(format="gray")[0::2].astype(np.float32)
        assert np.abs(top - got).mean() < 4.0


def test_progressive_source_is_untouched(demo_video, tmp_path):
    r = transcode_span(demo_video[0], tmp_path / "p.mp4", 0.5, 1.5, preset="ultrafast")
    assert not r.deinterlaced
