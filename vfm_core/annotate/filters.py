"""Clip filter scores and the reasons a clip is rejected.

Scores are computed on a clip's analysis-size frames (T, H, W, 3) sampled at about
`FilterConfig.sample_fps` frames per second:

- motion: mean |luma[t] - luma[t-1]| / 255 between consecutive samples (frame-difference energy);
- static_frac: fraction of consecutive sample pairs whose difference is below `static_eps`;
- black_frac: fraction of frames whose 98th-percentile luma is below `black_level`;
- blank_frac: fraction of frames that are flat (luma standard deviation below `blank_std`),
  e.g. a uniform grey or colour card.

`reject_reasons` turns scores plus the clip's size and duration into human-readable reasons; a
clip with no reason is accepted.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(kw_only=True, slots=True)
class FilterConfig:
    """Thresholds of the clip filters."""

    sample_fps: float = 8.0
    """Frames per second of clip time that are scored."""
    min_motion: float = 0.003
    """Reject clips whose mean frame difference (0..1) is below this (too little motion)."""
    static_eps: float = 0.002
    """A sample pair whose frame difference is below this counts as static."""
    max_static_frac: float = 0.8
    """Reject clips with a larger fraction of static sample pairs."""
    black_level: float = 24.0
    """A frame is black when its 98th-percentile luma is below this (0..255)."""
    max_black_frac: float = 0.5
    """Reject clips with a larger fraction of black frames."""
    blank_std: float = 4.0
    """A frame is blank (flat) when its luma standard deviation is below this (0..255)."""
    max_blank_frac: float = 0.5
    """Reject clips with a larger fraction of blank frames."""
    min_width: int = 64
    """Reject clips narrower than this (pixels)."""
    min_height: int = 36
    """Reject clips lower than this (pixels)."""
    min_duration_s: float = 1.0
    """Reject clips shorter than this (seconds)."""
    max_duration_s: float | None = None
    """Reject clips longer than this (None: no limit)."""


@dataclass(kw_only=True, slots=True, frozen=True)
class FilterScores:
    """Filter scores of one clip (see the module docstring)."""

    motion: float
    static_frac: float
    black_frac: float
    blank_frac: float


def _luma(frames: np.ndarray) -> np.ndarray:
    f = frames.astype(np.float32)
    return f[..., 0] * 0.299 + f[..., 1] * 0.587 + f[..., 2] * 0.114  # (T, H, W)


def sample_indices(n_frames: int, fps: float, sample_fps: float) -> np.ndarray:
    """Indices of about `sample_fps` frames per second of a clip of `n_frames` at `fps`."""
    step = max(1, int(round(fps / max(sample_fps, 1e-6))))
    return np.arange(0, n_frames, step)


def score_frames(frames: np.ndarray, cfg: FilterConfig | None = None) -> FilterScores:
    """Scores of already-sampled RGB uint8 frames (T, H, W, 3), T >= 1."""
    cfg = cfg or FilterConfig()
    if frames.ndim != 4 or frames.shape[-1] != 3 or len(frames) == 0:
        raise ValueError(f"score_frames: expected (T>=1, H, W, 3) frames, got {frames.shape}")
    y = _luma(frames)  # (T, H, W)
    flat = y.reshape(len(y), -1)  # (T, H*W)
    k = int(0.98 * (flat.shape[1] - 1))
    bright = np.partition(flat, k, axis=1)[:, k]  # (T,)
    black = float((bright < cfg.black_level).mean())
    blank = float((flat.std(axis=1) < cfg.blank_std).mean())
    if len(y) > 1:
        d = np.abs(np.diff(y, axis=0)).mean(axis=(1, 2)) / 255.0  # (T-1,)
        motion, static = float(d.mean()), float((d < cfg.static_eps).mean())
    else:
        motion, static = 0.0, 1.0  # one frame: no motion by definition
    return FilterScores(motion=motion, static_frac=static, black_frac=black, blank_frac=blank)


def reject_reasons(
    scores: FilterScores, *, width: int, height: int, duration_s: float, cfg: FilterConfig
) -> list[str]:
    """Why a clip is rejected (empty: accepted)."""
    out = []
    if width < cfg.min_width or height < cfg.min_height:
        out.append(f"resolution {width}x{height} below minimum {cfg.min_width}x{cfg.min_height}")
    if duration_s < cfg.min_duration_s:
        out.append(f"duration {duration_s:.2f} s below minimum {cfg.min_duration_s:g} s")
    if cfg.max_duration_s is not None and duration_s > cfg.max_duration_s:
        out.append(f"duration {duration_s:.2f} s above maximum {cfg.max_duration_s:g} s")
    if scores.black_frac > cfg.max_black_frac:
        out.append(f"black: {scores.black_frac:.0%} of frames black (max {cfg.max_black_frac:.0%})")
    if scores.blank_frac > cfg.max_blank_frac:
        out.append(f"blank: {scores.blank_frac:.0%} of frames flat (max {cfg.max_blank_frac:.0%})")
    if scores.static_frac > cfg.max_static_frac:
        out.append(
            f"static: {scores.static_frac:.0%} of frame pairs unchanged "
            f"(max {cfg.max_static_frac:.0%})"
        )
    elif scores.motion < cfg.min_motion:
        out.append(f"low motion: {scores.motion:.4f} below {cfg.min_motion:g}")
    return out
