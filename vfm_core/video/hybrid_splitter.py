"""`HybridSplitter`: the colour-change detector plus a spatial-layout cue, for the cuts colour
alone misses (two shots of the same set, a jump inside one take: same colours, new layout).

One decode (the colour splitter's: analysis width, no loop filter, plane-sampled) feeds both
signals. Besides the colour features, every frame becomes a `grid` of block-mean lumas
(`grid_w` x `grid_h` cells), normalised to zero mean and unit spread so that a brightness change or
a fade does not move it. The layout distance

    s[t] = mean |grid[t] - grid[t - 1]|

is large at a cut, and also during fast motion; what tells them apart is that a cut is ONE
frame-pair event: motion moves the layout on the frames either side too, a cut does not. So a
layout cut at t needs

- s[t] >= `layout_min` (the layout really changed), and s[t] is the maximum of [t-2, t+2];
- s[t] >= `layout_ratio` x max(s[t-2], s[t-1], s[t+1], s[t+2]) (the pairs around it are within
  one shot; two either side because some motion alternates big and small steps);
- the colour distance d1 also steps there: d1[t] >= `color_min` and >= `color_ratio` x the same
  neighbour max of d1 (a cut changes every region at once; a moving object does not);

or the same with the roles swapped (d1[t] >= the colour splitter's `cut_min` and `layout_ratio` x
its neighbours, s[t] >= `color_ratio` x its neighbours): a big colour step backed by the layout;

then it is added to the colour detector's cuts, unless a cut, gradual transition or black run
already lies within +-2 frames. A camera flash changes two consecutive pairs (on and off), so it
fails the one-pair test; so does a pan. A "gradual transition" of the colour detector with such a
one-pair step in it, or at both its ends, was a short shot of fast motion between two hard cuts
(every frame of it changes a lot and its ends are stable): it becomes those cuts, since a dissolve
blends over many frames and has no single-pair step. A step at one end only is a cut just before
(after) a dissolve whose longest window reached back (on) to it: the cut and the dissolve both
stay (`_between_cuts`).

Cost: the grid is a block mean of the already-decoded analysis frames, a small fraction of the
decode (benchmarks/real_cuts.py measures both on real footage).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from vfm_core.video.frame_features import (
    GRID_H,
    GRID_W,
    FeatureAccumulator,
    FrameFeatures,
    FramesOrSource,
    block_means,
    frame_chunks,
    luma,
)
from vfm_core.video.io import SKIP_LOOP_FILTER
from vfm_core.video.shots import (
    ColorChangeSplitter,
    Detection,
    fps_of,
    local_max,
    picture_change,
)
from vfm_core.video.spans import LengthRules, Segmentation, Span


@dataclass(kw_only=True, slots=True)
class HybridSplitter:
    """Colour-change cuts / transitions / black runs, plus cuts seen in the layout of the frame."""

    color: ColorChangeSplitter = field(default_factory=ColorChangeSplitter)
    """The colour detector (its `lengths` and `drop_black` are replaced by this splitter's)."""
    grid_w: int = 16
    """Layout grid columns."""
    grid_h: int = 9
    """Layout grid rows."""
    layout_min: float = 0.08
    """Smallest layout distance of a cut (grid in units of its own spread): ~0.01-0.05 between
    frames of a slow shot, 0.1-0.2 for a jump inside one slow take, ~1-1.6 between unrelated
    pictures."""
    layout_ratio: float = 2.5
    """s[t] must exceed this times the largest of its neighbours s[t-2 .. t+2]."""
    color_ratio: float = 2.0
    """d1[t] must exceed this times the largest of d1[t-2 .. t+2] (t excluded)."""
    color_min: float = 0.07
    """... and be at least this (0..1): a jump inside one slow take is ~0.09-0.1, the jitter of a
    textured moving picture (whose small layout can twitch from one pair to the next) ~0.01-0.06."""
    drop_black: bool = True
    """Leave black runs out of the returned spans."""
    lengths: LengthRules = field(default_factory=LengthRules)
    """Min / max clip length rules."""

    def split(self, source: FramesOrSource, *, fps: float | None = None) -> list[Span]:
        return self.segment(source, fps=fps).spans

    def segment(self, source: FramesOrSource, *, fps: float | None = None) -> Segmentation:
        fps_ = fps_of(source, fps)
        feats, grid = self.features(source)
        det = self.detect(feats, grid, fps_)
        return self._color().segmentation(det, fps_, times=feats.times)

    def _color(self) -> ColorChangeSplitter:
        return replace(self.color, lengths=self.lengths, drop_black=self.drop_black)

    def features(self, source: FramesOrSource) -> tuple[FrameFeatures, np.ndarray]:
        """Colour features and the (T, grid_h, grid_w) normalised layout grid, one decode."""
        opts = SKIP_LOOP_FILTER if self.color.skip_loop_filter else None
        acc = FeatureAccumulator()
        grids: list[np.ndarray] = []
        same = (self.grid_w, self.grid_h) == (GRID_W, GRID_H)  # the features' grid is the layout's
        for c, ts in frame_chunks(source, self.color.analysis_width, 256, "AUTO", opts):
            acc.add(c, ts)
            if not same:
                grids.append(layout_grid(c, self.grid_w, self.grid_h))
        feats = acc.result()
        if same and feats.grid is not None:
            return feats, normalise(luma(feats.grid))
        empty = np.zeros((0, self.grid_h, self.grid_w), np.float32)
        return feats, (np.concatenate(grids) if grids else empty)

    def detect(self, feats: FrameFeatures, grid: np.ndarray, fps: float) -> Detection:
        """The colour detection with the layout cuts added (and false dissolves undone)."""
        det = self._color().detect(feats, fps)
        t_n = det.n_frames
        if t_n < 3:
            return det
        s = np.zeros(t_n, np.float32)
        s[1:] = np.abs(grid[1:] - grid[:-1]).mean(axis=(1, 2))
        d1 = det.score
        s_nb, d_nb = _neighbour_max(s, 2), _neighbour_max(d1, 2)
        eps = 0.01  # as the colour splitter's: ratios of near-zero distances are noise
        # a one-pair step in the layout backed by a smaller step in colour, or the other way
        # round (a big colour step, e.g. at the end of a fast-motion shot, backed by the layout)
        layout_step = (
            (s >= self.layout_min)
            & (s >= self.layout_ratio * (s_nb + eps))
            & (d1 >= self.color_min)
            & (d1 >= self.color_ratio * (d_nb + eps))
        )
        color_step = (
            (d1 >= self.color.cut_min)
            & (d1 >= self.layout_ratio * (d_nb + eps))
            & (s >= self.color_ratio * (s_nb + eps))
        )
        hit = (layout_step | color_step) & local_max(s, 2)
        hit &= picture_change(feats) >= self.color.cut_pixels
        hit[0] = False
        hits = np.flatnonzero(hit).tolist()
        det.gradual = [g for g in det.gradual if not _between_cuts(g, hits)]
        taken = [(c, c) for c in det.cuts] + det.gradual + det.black
        extra = [t for t in hits if not any(a - 2 <= t <= b + 2 for a, b in taken)]
        det.cuts = sorted(det.cuts + extra)
        return det


def _between_cuts(span: tuple[int, int], hits: list[int]) -> bool:
    """Whether a "gradual transition" [a, b) was a short shot of fast motion between two hard
    cuts: one-pair steps inside it, or at both its ends. A step at one end only is a cut just
    before (after) a dissolve whose window reached it: both are kept."""
    a, b = span
    inside = any(a + 2 < t < b - 2 for t in hits)
    return inside or (any(abs(t - a) <= 2 for t in hits) and any(abs(t - b) <= 2 for t in hits))


def _neighbour_max(x: np.ndarray, half: int) -> np.ndarray:
    """Max of x over [t - half, t + half] without t itself (edge-padded). Two pairs either side,
    not one: some motion (and some encoders) alternate big and small steps from frame to frame,
    and against its next neighbours such a big step looks like a lone spike."""
    p = np.pad(x, half, mode="edge")
    w = np.lib.stride_tricks.sliding_window_view(p, 2 * half + 1).copy()  # (T, 2h+1)
    w[:, half] = -np.inf
    return w.max(axis=-1)


def layout_grid(frames: np.ndarray, gw: int, gh: int) -> np.ndarray:
    """(T, H, W, 3) uint8 -> (T, gh, gw) float32 block-mean luma, normalised (`normalise`)."""
    return normalise(block_means(luma(frames), gw, gh))


def normalise(g: np.ndarray) -> np.ndarray:
    """(T, gh, gw) block-mean luma -> each frame at zero mean and unit mean-absolute deviation (a
    brightness change or fade leaves it unchanged)."""
    g = g - g.mean(axis=(1, 2), keepdims=True)
    spread = np.abs(g).mean(axis=(1, 2), keepdims=True)
    # a flat frame (black, one colour) has no layout: keep it near zero rather than amplify noise
    return (g / np.maximum(spread, 2.0)).astype(np.float32)
