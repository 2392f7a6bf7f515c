"""The filter test set: scenes a person would keep (an isoluminant colour pattern, a slow pan of a
smooth scene, a small moving object) are accepted; scenes a person would drop (black, frozen,
one colour) are rejected with a reason that names the threshold."""

from __future__ import annotations

import numpy as np
import pytest

from vfm_core.annotate.filters import FilterConfig, global_shift, reject_reasons, score_frames

T, H, W = 8, 64, 64
yy, xx = np.mgrid[0:H, 0:W].astype(np.float32)


def _frames(fn) -> np.ndarray:
    return np.stack([np.clip(fn(t), 0, 255).astype(np.uint8) for t in range(T)])


def isoluminant(t):  # red and green stripes of equal luma (~110), moving 2 px per frame
    a, b = np.array([180, 80, 80]), np.array([40, 160, 38])
    stripe = (((xx + 2 * t) // 8) % 2)[..., None]
    return stripe * a + (1 - stripe) * b


def slow_pan(t):  # a smooth scene (long waves, small amplitude) panning 1 px per frame
    x = xx + t
    v = 120 + 6 * np.sin(2 * np.pi * x / 40) + 6 * np.cos(2 * np.pi * yy / 56)
    return np.repeat(v[..., None], 3, axis=-1)


def small_object(t):  # a 6x6 square crossing a grey background at 2 px per frame
    img = np.full((H, W, 3), 110.0)
    img[30:36, 10 + 2 * t : 16 + 2 * t] = (230, 40, 40)
    return img


def black(t):
    return np.full((H, W, 3), 6.0)


def frozen(t):  # a textured frame that never changes
    return np.random.default_rng(0).uniform(0, 255, (H, W, 3))


def one_colour(t):
    return np.broadcast_to(np.array([120.0, 40.0, 200.0]), (H, W, 3))


def _reasons(fn):
    s = score_frames(_frames(fn))
    return s, reject_reasons(s, width=640, height=360, duration_s=4.0, cfg=FilterConfig())


@pytest.mark.parametrize("scene", [isoluminant, slow_pan, small_object])
def test_scenes_a_person_keeps_are_accepted(scene):
    scores, reasons = _reasons(scene)
    assert reasons == [], (scene.__name__, scores, reasons)


@pytest.mark.parametrize(
    "scene,word,threshold",
    [
        (black, "black", "black_level"),
        (frozen, "static", "static_eps"),
        (one_colour, "blank", "blank_std"),
    ],
)
def test_scenes_a_person_drops_are_rejected_naming_the_threshold(scene, word, threshold):
    _, reasons = _reasons(scene)
    joined = "; ".join(reasons)
    assert word in joined and threshold in joined, (scene.__name__, reasons)


def test_luma_alone_would_have_dropped_the_kept_scenes():
    """What the luma-only scores said: the isoluminant pattern is flat in luma, the slow pan and
    the small object move less than min_motion in frame difference."""
    iso = _frames(isoluminant).astype(np.float32)
    luma = iso @ np.array([0.299, 0.587, 0.114], dtype=np.float32)
    assert luma.reshape(T, -1).std(axis=1).max() < FilterConfig().blank_std
    for scene in (slow_pan, small_object):
        s = score_frames(_frames(scene))
        assert s.motion < FilterConfig().min_motion and s.pan_px >= FilterConfig().min_pan_px


def test_global_shift_measures_translation():
    img = np.random.default_rng(1).uniform(0, 1, (64, 64))
    assert global_shift(img, np.roll(img, 3, axis=1)) == pytest.approx(3.0, abs=0.05)
    assert global_shift(img, np.roll(img, (-2, 2), axis=(0, 1))) == pytest.approx(2.83, abs=0.05)
    assert global_shift(np.zeros((8, 8)), np.zeros((8, 8))) == 0.0
