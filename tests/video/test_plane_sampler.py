"""The plane sampler behind `iter_frames(resize="sample")` is bit-exact to the BT.601 formula."""

import av
import numpy as np
import pytest

from vfm_core.video.io import iter_frames, iter_sampled_chunks
from vfm_core.video.plane_sampler import SAMPLED_FORMATS, PlaneSampler


def _reference(frame: av.VideoFrame, w: int, h: int) -> np.ndarray:
    """Per-pixel float32 BT.601 conversion of point samples (the sampler's specification)."""
    ys = ((np.arange(h) + 0.5) * frame.height / h).astype(np.intp).clip(0, frame.height - 2)
    xs = ((np.arange(w) + 0.5) * frame.width / w).astype(np.intp).clip(0, frame.width - 2)
    sub = SAMPLED_FORMATS[frame.format.name]
    planes = []
    for i, p in enumerate(frame.planes[:3]):
        a = np.frombuffer(p, np.uint8).reshape(-1, p.line_size)  # (ph, stride)
        if i == 0:
            yy, xx = ys[:, None], xs[None, :]
            s = a[yy, xx].astype(np.uint16) + a[yy + 1, xx] + a[yy, xx + 1] + a[yy + 1, xx + 1]
            q = (s + 2) >> 2  # (h, w) rounded 2x2 mean of luma
        else:
            q = a[(ys // sub)[:, None], (xs // sub)[None, :]]  # (h, w)
        planes.append(q.astype(np.float32))
    y, u, v = planes[0], planes[1] - 128.0, planes[2] - 128.0
    if frame.format.name.startswith("yuvj"):
        yf = y
    else:
        yf = (y - 16.0) * (255.0 / 219.0)
        u, v = u * (255.0 / 224.0), v * (255.0 / 224.0)
    rgb = np.stack([yf + 1.402 * v, yf - 0.344136 * u - 0.714136 * v, yf + 1.772 * u], -1)
    return np.clip(rgb + 0.5, 0, 255).astype(np.uint8)  # (h, w, 3)


@pytest.mark.parametrize("fmt", sorted(SAMPLED_FORMATS))
def test_sampler_matches_formula_bit_for_bit(fmt):
    rng = np.random.default_rng(0)
    rgb = rng.integers(0, 256, (90, 130, 3), dtype=np.uint8)  # odd size: padded line sizes
    frame = av.VideoFrame.from_ndarray(rgb, format="rgb24").reformat(format=fmt)
    for w, h in ((64, 36), (17, 11), (128, 88)):
        s = PlaneSampler(frame.width, frame.height, w, h)
        np.testing.assert_array_equal(s(frame), _reference(frame, w, h))


def test_sampler_covers_every_yuv_code():
    """Every (U, V) pair at 33 luma codes (0..255) through the tables equals the formula."""
    for fmt in ("yuv444p", "yuvj444p"):
        s = PlaneSampler(512, 512, 256, 256)  # distinct sample rows / columns
        for y in (*range(0, 255, 8), 255):
            frame = av.VideoFrame(512, 512, fmt)
            planes = [np.frombuffer(p, np.uint8).reshape(-1, p.line_size) for p in frame.planes[:3]]
            planes[0][:] = y  # constant luma: the 2x2 mean is y itself
            planes[1][s.ys[:, None], s.xs[None, :]] = np.arange(256)[:, None]  # U = output row
            planes[2][s.ys[:, None], s.xs[None, :]] = np.arange(256)[None, :]  # V = output col
            np.testing.assert_array_equal(s(frame), _reference(frame, 256, 256))


def test_sample_resize_on_video(demo_video):
    path, _ = demo_video
    with av.open(str(path)) as c:
        frame = next(c.decode(video=0))
    first = next(iter_frames(path, width=64, resize="sample"))[1]
    np.testing.assert_array_equal(first, _reference(frame, 64, first.shape[0]))


def test_chunks_are_the_sampled_frames(demo_video, bad_inputs):
    """`iter_sampled_chunks` (the splitter's decode: one RGB conversion a chunk) gives
    `iter_frames(resize="sample")`'s frames and times bit for bit, across chunk boundaries, for
    8-bit 4:2:0 / 4:4:4 and for a format the sampler leaves to swscale (10-bit)."""
    for path in (demo_video[0], bad_inputs["yuv444"], bad_inputs["10bit"]):
        one = list(iter_frames(path, width=48, resize="sample"))
        chunks = list(iter_sampled_chunks(path, width=48, chunk=7))
        assert [len(t) for _, t in chunks[:-1]] == [7] * (len(chunks) - 1)
        np.testing.assert_array_equal(np.concatenate([f for f, _ in chunks]), [a for _, a in one])
        assert [t for _, ts in chunks for t in ts] == [t for t, _ in one]
