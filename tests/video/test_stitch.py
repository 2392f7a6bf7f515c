import numpy as np
import pytest

from vfm_core.video.frame_features import compute_features
from vfm_core.video.io import decode_frames
from vfm_core.video.shots import ColorChangeSplitter
from vfm_core.video.spans import Span
from vfm_core.video.stitch import color_thumb_embed, span_ends, stitch


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


def test_stitch_from_split_features_needs_no_frames(demo_video):
    """Ends from the splitter's features == embedding its analysis frames; same merges."""
    path, _ = demo_video
    frames = decode_frames(path, width=64, resize="sample")  # what the splitter analyses
    feats = compute_features(path)
    spans = _spans([0, 30, 60, 75, 150, 180, 220])
    ends = span_ends(spans, feats)
    for s, (head, tail) in zip(spans, ends, strict=True):
        a, b = s.start_frame, s.end_frame
        np.testing.assert_array_equal(head, color_thumb_embed(frames[a : a + 3]).mean(0))
        np.testing.assert_array_equal(tail, color_thumb_embed(frames[b - 3 : b]).mean(0))
    out = stitch(spans, ends=ends)
    assert out == stitch(spans, frames)
    assert [(s.start_frame, s.end_frame) for s in out] == [(0, 60), (60, 180), (180, 220)]
    assert stitch(spans, ends=ends, max_frames=40) == stitch(spans, frames, max_frames=40)
    with pytest.raises(ValueError, match="6 span ends for 5 spans"):
        stitch(spans[:5], ends=ends)
    with pytest.raises(ValueError, match="give the frames"):
        stitch(spans)


def test_split_features_spans_equal_split(demo_video):
    path, _ = demo_video
    sp = ColorChangeSplitter()
    spans, feats = sp.split_features(path, fps=24.0)
    assert spans == sp.split(path, fps=24.0) and feats.thumbs.shape == (len(feats.hist), 8, 8, 3)
