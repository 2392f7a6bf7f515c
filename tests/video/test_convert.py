"""FrameConverter: reused swscale contexts, one per conversion, give a fresh context's pixels."""

from __future__ import annotations

import av
import numpy as np

from vfm_core.video.convert import FrameConverter


def test_alternating_conversions_match_fresh_contexts():
    rng = np.random.default_rng(0)
    fc = FrameConverter()
    for _ in range(4):
        # the rotated transcode's pair of conversions, alternating on one converter
        yuv = av.VideoFrame.from_ndarray(rng.integers(0, 256, (64, 96, 3), np.uint8), "rgb24")
        yuv = yuv.reformat(format="yuv420p")  # (64, 96) coded, like a decoded frame
        rgb = fc.convert(yuv, format="rgb24", width=48, height=32).to_ndarray()  # (32, 48, 3)
        np.testing.assert_array_equal(rgb, yuv.to_ndarray(format="rgb24", width=48, height=32))
        up = av.VideoFrame.from_ndarray(np.ascontiguousarray(np.rot90(rgb)), "rgb24")
        back = fc.convert(up, format="yuv420p")
        fresh = up.reformat(format="yuv420p")
        np.testing.assert_array_equal(back.to_ndarray(), fresh.to_ndarray())  # planes, no padding
    assert len(fc._contexts) == 2  # one context per conversion, never re-initialised for another
