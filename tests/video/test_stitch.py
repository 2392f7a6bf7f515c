import numpy as np

from vfm_core.video.io import decode_frames
from vfm_core.video.shots import Span
from vfm_core.video.stitch import color_thumb_embed, stitch


def _spans(edges: list[int], fps: float = 24.0) -> list[Span]:
    return [Span.of(a, b, fps) for a, b in zip(edges[:-1], edges[1:], strict=True)]


def test_embedder_shape_and_norm():
    frames = np.random.default_rng(0).integers(0, 255, (5, 36, 64, 3), dtype=np.uint8)
    e = color_thumb_embed(frames)
    assert e.shape[0] == 5 and np.allclose(np.linalg.norm(e, axis=1), 1, atol=1e-4)


def test_stitch_undoes_false_cuts_keeps_true_ones(demo_video):
    path, gt = demo_video
    frames = decode_frames(path, width=64)
    # true hard cuts at 60 and 180, false cuts inside shots at 30, 75 and 150
    spans = _spans([0, 30, 60, 75, 150, 180, 220])
    out = stitch(spans, frames)
    assert [(s.start_frame, s.end_frame) for s in out] == [(0, 60), (60, 180), (180, 220)]
    # the same, decoding only the boundary frames from the video file
    assert stitch(spans, path) == out


def test_stitch_respects_gaps_and_max_frames(demo_video):
    path, _ = demo_video
    frames = decode_frames(path, width=64)
    gap = [Span.of(0, 20, 24.0), Span.of(22, 40, 24.0)]
    assert stitch(gap, frames) == gap  # not touching: a dropped transition in between
    windows = _spans([0, 20, 40, 60])
    assert stitch(windows, frames, max_frames=30) == windows
    assert len(stitch(windows, frames, max_frames=40)) == 2
