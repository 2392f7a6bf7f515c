"""Per-frame features of the colour-change splitter (and the stitch embedder's input): joint HSV
histograms (16 x 4 x 4 bins), 8 x 8 thumbnails, mean luma change and 98th-percentile luma, from RGB
uint8 frames (T, H, W, 3) or decoded chunk by chunk from a video at analysis size.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import numpy as np

from vfm_core.video.container import Source
from vfm_core.video.io import iter_sampled_chunks

FramesOrSource = Source | np.ndarray


HUE_BINS, SAT_BINS, VAL_BINS = 16, 4, 4
N_BINS = HUE_BINS * SAT_BINS * VAL_BINS


def _hsv_bins(x: np.ndarray) -> np.ndarray:
    """Joint HSV bin (0..N_BINS-1) of RGB values (..., 3) -> (...) int32."""
    x = x.astype(np.int16)
    r, g, b = x[..., 0], x[..., 1], x[..., 2]
    mx = np.maximum(np.maximum(r, g), b)
    mn = np.minimum(np.minimum(r, g), b)
    c = (mx - mn).astype(np.float32)
    cs = np.where(c == 0, 1.0, c)
    hue = np.where(
        mx == r, ((g - b) / cs) % 6.0, np.where(mx == g, (b - r) / cs + 2.0, (r - g) / cs + 4.0)
    )  # in [0, 6)
    hq = np.minimum((hue * (HUE_BINS / 6.0)).astype(np.int32), HUE_BINS - 1)
    sat = c / np.maximum(mx, 1).astype(np.float32)
    sq = np.minimum((sat * SAT_BINS).astype(np.int32), SAT_BINS - 1)
    vq = (mx.astype(np.int32) * VAL_BINS) >> 8
    hq = np.where(sq == 0, 0, hq)  # hue is noise for grey pixels
    return (hq * SAT_BINS + sq) * VAL_BINS + vq


_BIN_LUT: np.ndarray | None = None


def _bin_lut() -> np.ndarray:
    """HSV bin of every 24-bit RGB colour, index (r << 16) | (g << 8) | b (16 MiB, built once per
    process in ~0.16 s; `_hsv_bins` over every colour took ~0.4 s, on a video's critical path).

    Exactly `_hsv_bins`: its float32 hue and saturation are computed in its own dtypes into small
    tables, by (max channel, numerator, chroma) and by (max, min), then looked up one red value
    at a time.
    """
    global _BIN_LUT
    if _BIN_LUT is None:
        v = np.arange(256, dtype=np.int16)
        num = np.arange(-255, 256, dtype=np.int16)[:, None]  # (511, 1): the hue's numerator
        c = v[None, :].astype(np.float32)  # (1, 256): chroma max - min
        cs = np.where(c == 0, 1.0, c)
        hue = np.stack([(num / cs) % 6.0, num / cs + 2.0, num / cs + 4.0])  # (3, 511, 256):
        # the max channel r, g or b, as `_hsv_bins` orders ties
        h_tab = np.minimum((hue * (HUE_BINS / 6.0)).astype(np.int32), HUE_BINS - 1)
        h_tab = h_tab.astype(np.uint8).reshape(-1)  # [(which * 511 + num + 255) * 256 + chroma]
        mx_, mn_ = v[:, None], v[None, :]
        sat = (mx_ - mn_).astype(np.float32) / np.maximum(mx_, 1).astype(np.float32)
        s_tab = np.minimum((sat * SAT_BINS).astype(np.int32), SAT_BINS - 1)  # (max, min)
        vq = (v[:, None].astype(np.int32) * VAL_BINS) >> 8  # (256, 1) by max
        sv_tab = (s_tab * VAL_BINS + vq).astype(np.uint8)
        sv_tab, grey = sv_tab.reshape(-1), (s_tab == 0).reshape(-1)  # [max * 256 + min]
        g, b = v[:, None].astype(np.int32), v[None, :].astype(np.int32)  # (256, 1), (1, 256)
        gb_max, gb_min, g_ge_b = np.maximum(g, b), np.minimum(g, b), g >= b  # (256, 256)
        lut = np.empty((256, 256, 256), np.uint8)
        for r in range(256):
            mx, mn = np.maximum(gb_max, r), np.minimum(gb_min, r)  # (256, 256)
            row = np.where(  # which channel is the max (r, then g, then b on ties): numerator
                gb_max <= r,
                g - b + 255,
                np.where(g_ge_b, 511 + b - r + 255, 2 * 511 + r - g + 255),
            )
            hq = h_tab[row * 256 + (mx - mn)]
            k = mx * 256 + mn
            hq[grey[k]] = 0  # hue is noise for grey pixels
            lut[r] = hq * (SAT_BINS * VAL_BINS) + sv_tab[k]
        _BIN_LUT = lut.reshape(-1)
    return _BIN_LUT


def hsv_histograms(frames: np.ndarray) -> np.ndarray:
    """Normalised joint HSV histograms of RGB uint8 frames (T, H, W, 3) -> (T, N_BINS) float32.

    uint8 frames go through a lookup table of every colour's bin (exactly `_hsv_bins`, ~8x
    faster per frame); other dtypes are binned directly.
    """
    t = frames.shape[0]
    x = frames.reshape(t, -1, 3)  # (T, P, 3)
    if x.dtype == np.uint8:
        # (r << 16) | (g << 8) | b built in place: one int32 temporary instead of five
        idx = x[..., 0].astype(np.int32)  # (T, P)
        idx <<= 8
        idx |= x[..., 1]
        idx <<= 8
        idx |= x[..., 2]
        bins = _bin_lut()[idx].astype(np.int32)  # (T, P)
    else:
        bins = _hsv_bins(x)  # (T, P)
    bins += (np.arange(t, dtype=np.int32) * N_BINS)[:, None]
    hist = np.bincount(bins.ravel(), minlength=t * N_BINS).reshape(t, N_BINS)
    return (hist / x.shape[1]).astype(np.float32)  # (T, N_BINS), rows sum to 1


THUMB = 8


def thumbnails(frames: np.ndarray) -> np.ndarray:
    """(T, H, W, 3) -> (T, THUMB, THUMB, 3): point samples at the cell centres (stitch embedder)."""
    h, w = frames.shape[1:3]
    ys = ((np.arange(THUMB) + 0.5) * h / THUMB).astype(np.intp)
    xs = ((np.arange(THUMB) + 0.5) * w / THUMB).astype(np.intp)
    return frames[:, ys[:, None], xs[None, :]]  # (T, THUMB, THUMB, 3)


GRID_W, GRID_H = 16, 9


def block_means(x: np.ndarray, gw: int = GRID_W, gh: int = GRID_H) -> np.ndarray:
    """(T, H, W, ...) -> (T, gh, gw, ...) float32 means over a gh x gw grid of blocks. A frame with
    fewer rows (columns) than the grid, a very wide (tall) video's analysis frame, has every row
    (column) repeated so that each cell covers at least one."""
    x = np.repeat(np.repeat(x, -(-gh // x.shape[1]), axis=1), -(-gw // x.shape[2]), axis=2)
    h, w = x.shape[1:3]
    rs = np.searchsorted((np.arange(h) * gh) // h, np.arange(gh))  # first row of every cell
    cs = np.searchsorted((np.arange(w) * gw) // w, np.arange(gw))
    g = np.add.reduceat(np.add.reduceat(x.astype(np.float32), rs, axis=1), cs, axis=2)  # sums
    area = np.diff(np.r_[rs, h])[:, None] * np.diff(np.r_[cs, w])[None, :]  # (gh, gw)
    return g / area.reshape(area.shape + (1,) * (x.ndim - 3)).astype(np.float32)


def luma(frames: np.ndarray) -> np.ndarray:
    """(T, H, W, 3) uint8 -> (T, H, W) float32 luma (BT.601)."""
    f = frames.astype(np.float32)
    return f[..., 0] * 0.299 + f[..., 1] * 0.587 + f[..., 2] * 0.114


@dataclass(kw_only=True, slots=True)
class FrameFeatures:
    """Per-frame signals the colour-change splitter thresholds."""

    hist: np.ndarray
    """(T, N_BINS) HSV histograms."""
    dpix: np.ndarray
    """(T,) mean |luma[t] - luma[t-1]| / 255 (0 at t=0)."""
    bright: np.ndarray
    """(T,) 98th-percentile luma (0..255)."""
    times: np.ndarray | None = None
    """(T,) presentation times in seconds when decoded from a video (None for arrays)."""
    thumbs: np.ndarray | None = None
    """(T, THUMB, THUMB, 3) uint8 thumbnails: with `hist`, the stitch embedder's input."""
    grid: np.ndarray | None = None
    """(T, GRID_H, GRID_W, 3) float32 block-mean RGB (0..255): a dissolve's frame is a blend of
    its ends here, a fade's a scaled end, a moving picture neither."""


class FeatureAccumulator:
    """Streams frame chunks into `FrameFeatures` (keeps only the previous frame's luma)."""

    def __init__(self) -> None:
        self.hist: list[np.ndarray] = []
        self.dpix: list[np.ndarray] = []
        self.bright: list[np.ndarray] = []
        self.thumbs: list[np.ndarray] = []
        self.grid: list[np.ndarray] = []
        self.times: list[float] = []
        self.prev: np.ndarray | None = None

    def add(self, frames: np.ndarray, times: list[float] | None = None) -> None:
        if times is not None:
            self.times += times
        y = luma(frames)  # (B, H, W)
        self.hist.append(hsv_histograms(frames))
        self.thumbs.append(thumbnails(frames))
        self.grid.append(block_means(frames))  # (B, GRID_H, GRID_W, 3)
        prev = y[:1] if self.prev is None else self.prev[None]
        yy = np.concatenate([prev, y], 0)  # (B + 1, H, W)
        self.dpix.append(np.abs(np.diff(yy, axis=0)).mean(axis=(1, 2)) / 255.0)
        flat = y.reshape(y.shape[0], -1)
        k = int(0.98 * (flat.shape[1] - 1))
        self.bright.append(np.partition(flat, k, axis=1)[:, k])
        self.prev = y[-1]

    def result(self) -> FrameFeatures:
        if not self.hist:
            return FrameFeatures(
                hist=np.zeros((0, N_BINS), np.float32), dpix=np.zeros(0), bright=np.zeros(0)
            )
        return FrameFeatures(
            hist=np.concatenate(self.hist),
            dpix=np.concatenate(self.dpix),
            bright=np.concatenate(self.bright),
            times=np.asarray(self.times) if self.times else None,
            thumbs=np.concatenate(self.thumbs),
            grid=np.concatenate(self.grid),
        )


def frame_chunks(
    source: FramesOrSource,
    width: int,
    chunk: int,
    threads: str = "AUTO",
    decoder_options: Mapping[str, str] | None = None,
) -> Iterator[tuple[np.ndarray, list[float] | None]]:
    """(frames (B, H, W, 3), their times or None for arrays) in chunks of `chunk` frames."""
    if isinstance(source, np.ndarray):
        for i in range(0, len(source), chunk):
            yield source[i : i + chunk], None
        return
    yield from iter_sampled_chunks(
        source, width=width, chunk=chunk, threads=threads, decoder_options=decoder_options
    )


def compute_features(
    source: FramesOrSource,
    *,
    width: int = 64,
    chunk: int = 256,
    threads: str = "AUTO",
    decoder_options: Mapping[str, str] | None = None,
) -> FrameFeatures:
    """Features of every frame of `source` (decoded at `width` px wide when it is a video, with
    FFmpeg `threads` and `decoder_options`, e.g. `io.SKIP_LOOP_FILTER`; see `iter_frames`)."""
    acc = FeatureAccumulator()
    for c, ts in frame_chunks(source, width, chunk, threads, decoder_options):
        acc.add(c, ts)
    return acc.result()
