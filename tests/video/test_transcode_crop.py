"""The transcode's crop of an even box of a yuv420p frame is cut from its planes: the source's
own samples, the same picture as the RGB route (which odd boxes and turned pictures keep)."""

from fractions import Fraction

import av
import numpy as np
import pytest

from vfm_core.video import transcode
from vfm_core.video.compositions import available_sources
from vfm_core.video.convert import FrameConverter
from vfm_core.video.io import decode_frames


def _frame(w: int = 96, h: int = 64) -> av.VideoFrame:
    rng = np.random.default_rng(0)
    y = rng.integers(16, 236, (h, w), dtype=np.uint8)
    uv = rng.integers(16, 241, (h // 2, w), dtype=np.uint8)  # U then V, packed as from_ndarray
    return av.VideoFrame.from_ndarray(np.concatenate([y, uv]), format="yuv420p")


def test_even_box_of_yuv420p_is_cut_from_the_planes():
    f, fc = _frame(), FrameConverter()
    x, y, w, h = 10, 4, 40, 24
    out = transcode._upright_frame(fc, f, k=0, crop=(x, y, w, h), width=w, height=h)
    assert (out.format.name, out.width, out.height) == ("yuv420p", w, h)
    planes = [np.frombuffer(p, np.uint8).reshape(-1, p.line_size) for p in f.planes]
    got = [np.frombuffer(p, np.uint8).reshape(-1, p.line_size) for p in out.planes]
    np.testing.assert_array_equal(got[0][:h, :w], planes[0][y : y + h, x : x + w])
    for i in (1, 2):
        np.testing.assert_array_equal(
            got[i][: h // 2, : w // 2], planes[i][y // 2 : (y + h) // 2, x // 2 : (x + w) // 2]
        )
    # the same picture as the RGB route gives (that one rounds through RGB and back)
    rgb = f.to_ndarray(format="rgb24")[y : y + h, x : x + w].astype(int)
    assert np.abs(out.to_ndarray(format="rgb24").astype(int) - rgb).max() <= 1
    # scaled after the cut; an odd box takes the RGB route, to the same size
    small = transcode._upright_frame(fc, f, k=0, crop=(x, y, w, h), width=20, height=12)
    odd = transcode._upright_frame(fc, f, k=0, crop=(x + 1, y, w, h), width=w, height=h)
    assert (small.width, small.height, odd.width, odd.height) == (20, 12, w, h)


def test_a_clip_states_its_sources_colours(tmp_path):
    """TransNetV2's sample says BT.709: its clip says so too, so a lossless clip decodes to the
    source's very colours, cropped or not (written unstated, it read back as BT.601: up to 7
    levels off)."""
    src = available_sources().get("mv")
    if src is None:
        pytest.skip("TransNetV2's wheel is not installed")
    whole = decode_frames(src.path, start_s=10.0, end_s=11.0)  # (25, 90, 160, 3)
    for crop in (None, (0, 2, 160, 86)):
        out = tmp_path / f"{crop}.mp4"
        transcode.transcode_span(src.path, out, 10.0, 11.0, crf=0, preset="ultrafast", crop=crop)
        with av.open(str(out)) as c:
            f = next(c.decode(video=0))
            assert (f.colorspace, f.color_range) == (1, 1)  # BT.709, limited range
        x, y, w, h = crop or (0, 0, 160, 90)
        np.testing.assert_array_equal(decode_frames(out), whole[:, y : y + h, x : x + w])


def test_non_square_pixels_become_square(tmp_path):
    """An anamorphic source (96x64 coded, pixels 3:2 wide: shown 144x64) gives a 144x64 clip,
    with or without a crop, and turned a quarter the stretch goes along the upright height."""
    src = tmp_path / "anamorphic.mp4"
    with av.open(str(src), "w") as c:
        s = c.add_stream("libx264", rate=25)
        s.width, s.height, s.pix_fmt = 96, 64, "yuv420p"
        s.codec_context.sample_aspect_ratio = Fraction(3, 2)
        for _ in range(10):
            for p in s.encode(_frame().reformat(format="yuv420p")):
                c.mux(p)
        for p in s.encode():
            c.mux(p)
    sizes = []
    for kw in ({}, {"crop": (0, 0, 48, 64)}, {"rotation": 90}, {"width": 72}):
        r = transcode.transcode_span(src, tmp_path / f"{len(sizes)}.mp4", 0.0, 0.4, **kw)
        assert decode_frames(r.path).shape[1:3] == (r.height, r.width)
        sizes.append((r.width, r.height))
    assert sizes == [(144, 64), (72, 64), (64, 144), (72, 32)]
    assert transcode._output_size(96, 64, k=0, crop=None, width=None, height=None, name="x") == (
        96,
        64,
    )  # square pixels: unchanged
