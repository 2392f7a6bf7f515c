"""The transcode's crop of an even box of a yuv420p frame is cut from its planes: the source's
own samples, the same picture as the RGB route (which odd boxes and turned pictures keep)."""

import av
import numpy as np

from vfm_core.video import transcode
from vfm_core.video.convert import FrameConverter


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
