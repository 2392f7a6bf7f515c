"""Shot splitting: one `Splitter` protocol, colour-change / fixed-stride / TransNetV2 splitters.

A splitter turns a video (a path / file object, or RGB uint8 frames (T, H, W, 3) with their fps)
into `Span`s: half-open frame ranges [start_frame, end_frame) with their times. Spans never overlap
and are in order. They cover the video except where a documented rule drops frames:

- frames inside a detected gradual transition (dissolve / fade) belong to no span;
- black segments become their own span, dropped when `drop_black` is set;
- spans shorter than `min_len_s` are dropped; spans longer than `max_len_s` are cut into equal
  windows no longer than `max_len_s` (so a long take yields several clips, and no remainder).

`Splitter.segment` returns both: the kept `Span`s and every dropped range as a `DroppedSpan` with
its reason (e.g. "shot 1.20 s < min 2.00 s"), so together they cover every decoded frame once and
curation can account for every second (`split` is `segment(...).spans`).

`ColorChangeSplitter` (the default, vfm's own) works on analysis-size frames (64 px wide, decoded
without the deblocking loop filter and sampled from the YUV planes) and scores each frame by
d1[t] = 0.7 x half-L1 distance of the joint HSV histograms (16 x 4 x 4 bins) of frames t-1 and t
+ 0.3 x (4 x mean luma difference, capped at 1):

1. hard cuts: d1[t] is the maximum of [t-2, t+2] and exceeds `cut_min`, `cut_ratio` x the
   rolling median of d1 over +-`window_s` (adaptive threshold) and `cut_standout` x the mean of
   its four neighbours d1[t-2, t-1, t+1, t+2] (a cut is one pair; a whip pan or fast motion
   spreads its change over several); a cut whose picture comes back within `flash_s` is a flash;
2. gradual transitions (dissolves, fades): a run of >= `grad_min_frames` frames whose d1 is
   elevated (>= `grad_step` and >= `grad_ratio` x a longer rolling median) whose NET histogram
   change first -> last frame is >= `grad_min` and is "sustained": the frames k/2 before and after
   the run are stable relative to that change (motion keeps changing; a transition lands). Hard cut
   candidates inside a gradual run are its own steps and are absorbed;
3. black runs: >= `min_black_frames` frames whose 98th-percentile luma is below `black_level`.

All of it is vectorised numpy over (T, bins) arrays; decoding dominates the cost. The span types
and length rules live in `video.spans`, the per-frame features in `video.frame_features`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import numpy as np

from vfm_core.video.frame_features import FrameFeatures, FramesOrSource, compute_features, luma
from vfm_core.video.gradual import GradualRules, find_gradual, is_flash
from vfm_core.video.io import SKIP_LOOP_FILTER, probe
from vfm_core.video.spans import (
    DroppedSpan,
    LengthRules,
    Segmentation,
    Span,
    dropped_span,
    segmentation,
    timed_span,
)


@runtime_checkable
class Splitter(Protocol):
    """Anything that splits a video into ordered, non-overlapping `Span`s."""

    def split(self, source: FramesOrSource, *, fps: float | None = None) -> list[Span]:
        """Spans of `source` (a path / file object, or RGB uint8 frames (T, H, W, 3) + `fps`)."""
        ...

    def segment(self, source: FramesOrSource, *, fps: float | None = None) -> Segmentation:
        """`split`'s spans plus every dropped range with its reason."""
        ...


def fps_of(source: FramesOrSource, fps: float | None) -> float:
    if fps is not None:
        return float(fps)
    if isinstance(source, np.ndarray):
        raise ValueError("fps is required when splitting an array of frames")
    return probe(source, allow_truncated=True).fps


# --- rolling statistics -----------------------------------------------------------------------


def _rolling(x: np.ndarray, half: int, fn) -> np.ndarray:
    """fn over the centred window [t - half, t + half] (edge-padded) -> same shape as x."""
    if x.size == 0:
        return x.copy()
    p = np.pad(x, half, mode="edge")
    return fn(np.lib.stride_tricks.sliding_window_view(p, 2 * half + 1), axis=-1)


def neighbour_mean(x: np.ndarray, half: int) -> np.ndarray:
    """Mean of x over [t - half, t + half] without t itself (edge-padded) -> same shape as x."""
    if x.size == 0:
        return x.copy()
    p = np.pad(x, half, mode="edge")
    w = np.lib.stride_tricks.sliding_window_view(p, 2 * half + 1)  # (T, 2h+1)
    return (w.sum(axis=-1) - x) / (2 * half)


def local_max(x: np.ndarray, half: int) -> np.ndarray:
    """True where x[t] is the (first) maximum of its window [t - half, t + half]."""
    if x.size == 0:
        return np.zeros(0, bool)
    p = np.pad(x, half, mode="constant", constant_values=-np.inf)
    w = np.lib.stride_tricks.sliding_window_view(p, 2 * half + 1)  # (T, 2h+1)
    return np.argmax(w, axis=-1) == half


# --- splitters --------------------------------------------------------------------------------


@dataclass(kw_only=True, slots=True)
class Detection:
    """What `ColorChangeSplitter.detect` found, in frame indices."""

    n_frames: int
    cuts: list[int]
    """Hard cuts: first frame of the new shot."""
    gradual: list[tuple[int, int]]
    """Gradual transitions: [start, end) frames excluded from both neighbouring shots."""
    black: list[tuple[int, int]]
    """Black runs [start, end)."""
    score: np.ndarray = field(repr=False)
    """(T,) frame-to-frame distance d1 (for inspection)."""


@dataclass(kw_only=True, slots=True)
class ColorChangeSplitter:
    """Adaptive HSV-histogram shot detector for hard cuts, dissolves/fades and black runs."""

    analysis_width: int = 64
    """Frames are decoded at this width (aspect kept) for analysis."""
    skip_loop_filter: bool = True
    """Decode the analysis frames without the deblocking loop filter (`io.SKIP_LOOP_FILTER`):
    ~15-30% less decoding on deblocked H.264, same cuts and fades (benchmarks/curation.py)."""
    cut_min: float = 0.25
    """Absolute floor of the frame-to-frame distance for a hard cut (0..1)."""
    cut_ratio: float = 3.0
    """A hard cut's distance must exceed this times the rolling median around it."""
    cut_standout: float = 2.5
    """... and this times the mean of its 4 neighbours d1[t-2, t-1, t+1, t+2] (PySceneDetect's
    AdaptiveDetector test): a whip pan or fast motion spreads its change over several pairs
    (ratio ~1.1-1.5), a cut is one pair (>= ~2.9 on real footage: a cut out of fast motion)."""
    cut_pixels: float = 0.02
    """... and the picture itself must change: the mean |luma step| or the mean |block-mean RGB
    step| at least this (0..1). A histogram jump with the pixels still (a flat colour at a bin
    edge, moved by the encoder's drift) is no cut; true cuts in `benchmarks/real_cuts.py`'s
    compositions change 0.058 or more (the least of 144)."""
    window_s: float = 1.0
    """Half-width of the rolling median window, seconds."""
    gradual: GradualRules = field(default_factory=GradualRules)
    """How a candidate becomes a dissolve / fade (`video.gradual`)."""
    flash_s: float = 0.2
    """A cut whose picture comes back within this many seconds is a flash (`gradual.is_flash`)."""
    flash_ratio: float = 0.35
    """... comes back: a frame pair across it is below this share of the cut's own step."""
    black_level: float = 24.0
    """A frame is black when its 98th-percentile luma is below this (0..255)."""
    min_black_frames: int = 3
    """Shorter dark runs are not black segments."""
    drop_black: bool = True
    """Leave black runs out of the returned spans."""
    lengths: LengthRules = field(default_factory=LengthRules)
    """Min / max clip length rules."""

    def split(self, source: FramesOrSource, *, fps: float | None = None) -> list[Span]:
        return self.split_features(source, fps=fps)[0]

    def segment(self, source: FramesOrSource, *, fps: float | None = None) -> Segmentation:
        fps_ = fps_of(source, fps)
        feats = self._features(source)
        return self.segmentation(self.detect(feats, fps_), fps_, times=feats.times)

    def split_features(
        self, source: FramesOrSource, *, fps: float | None = None
    ) -> tuple[list[Span], FrameFeatures]:
        """`split`, also returning the per-frame features (stitching reuses them: no re-decode)."""
        fps_ = fps_of(source, fps)
        feats = self._features(source)
        return self.spans(self.detect(feats, fps_), fps_, times=feats.times), feats

    def _features(self, source: FramesOrSource) -> FrameFeatures:
        opts = SKIP_LOOP_FILTER if self.skip_loop_filter else None
        return compute_features(source, width=self.analysis_width, decoder_options=opts)

    def spans(self, det: Detection, fps: float, times: np.ndarray | None = None) -> list[Span]:
        """Turn a detection into spans under the drop/length rules."""
        return self.segmentation(det, fps, times).spans

    def segmentation(
        self, det: Detection, fps: float, times: np.ndarray | None = None
    ) -> Segmentation:
        """Turn a detection into spans and dropped ranges (transitions, black, short shots)."""
        cuts: list[tuple[int, int]] = [(c, c) for c in det.cuts] + det.gradual
        black = det.black
        for a, b in black:
            cuts += [(a, a), (b, b)]
        cuts = sorted(c for c in cuts if 0 < c[1] and c[0] < det.n_frames)
        raw: list[tuple[int, int]] = []
        dropped: list[DroppedSpan] = []
        pos = 0
        for a, b in cuts:
            if a > pos:
                raw.append((pos, a))
            if b > max(a, pos):  # a gradual transition's blended frames
                span = timed_span(max(a, pos), b, fps, times)
                dropped.append(dropped_span(span, "gradual transition (dissolve / fade)"))
            pos = max(pos, b)
        if pos < det.n_frames:
            raw.append((pos, det.n_frames))
        if self.drop_black:
            bset = set(black)
            dropped += [
                dropped_span(timed_span(a, b, fps, times), "black segment")
                for a, b in raw
                if (a, b) in bset
            ]
            raw = [r for r in raw if r not in bset]
        spans, short = self.lengths.partition(raw, fps, times)
        return segmentation(spans, dropped + short, det.n_frames, fps, times)

    def detect(self, feats: FrameFeatures, fps: float) -> Detection:
        """Hard cuts, gradual transitions and black runs from per-frame features."""
        h = feats.hist  # (T, N_BINS)
        t_n = h.shape[0]
        if t_n < 2:
            return Detection(n_frames=t_n, cuts=[], gradual=[], black=[], score=np.zeros(t_n))
        w = max(2, int(round(self.window_s * fps)))
        # frame-to-frame distance: half L1 of histograms (0..1) mixed with luma change
        dh = np.zeros(t_n, np.float32)
        dh[1:] = 0.5 * np.abs(h[1:] - h[:-1]).sum(1)
        d1 = 0.7 * dh + 0.3 * np.minimum(1.0, 4.0 * feats.dpix)  # (T,)
        base = _rolling(d1, w, np.median)
        eps = 0.01
        is_cut = (d1 >= self.cut_min) & (d1 >= self.cut_ratio * (base + eps)) & local_max(d1, 2)
        is_cut &= d1 >= self.cut_standout * (neighbour_mean(d1, 2) + eps)
        is_cut &= picture_change(feats) >= self.cut_pixels
        is_cut[0] = False
        cuts = np.flatnonzero(is_cut).tolist()

        # black runs
        dark = feats.bright < self.black_level
        black: list[tuple[int, int]] = []
        for a, b in true_runs(dark):
            if b - a >= self.min_black_frames:
                black.append((a, b))
        # cuts at (or inside) black runs are the runs' edges
        cuts = [c for c in cuts if not any(a - 2 <= c <= b + 2 for a, b in black)]
        # a picture that comes back within flash_s is a flash, not a cut
        y, k = luma(_grid(feats)), max(2, int(round(self.flash_s * fps)))
        cuts = [c for c in cuts if not is_flash(h, y, c, k, self.flash_ratio)]

        gradual = self._gradual(feats, black, fps)
        # cut candidates inside a gradual transition are the transition's own steps
        cuts = [c for c in cuts if not any(a - 2 <= c <= b + 2 for a, b in gradual)]
        return Detection(n_frames=t_n, cuts=cuts, gradual=gradual, black=black, score=d1)

    def _gradual(
        self, feats: FrameFeatures, black: list[tuple[int, int]], fps: float
    ) -> list[tuple[int, int]]:
        """Verified dissolves / fades (`gradual.find_gradual`), black runs cut out of them."""
        out: list[tuple[int, int]] = []
        for a, b in find_gradual(feats.hist, _grid(feats), fps, self.gradual):
            for x, y in black:  # a fade through black: the black run is its own segment
                if x < b and a < y:
                    if x - a >= self.gradual.min_frames:
                        out.append((a, x))
                    a = max(a, y)
            if b - a >= self.gradual.min_frames:
                out.append((a, b))
        return out


def _grid(feats: FrameFeatures) -> np.ndarray:
    """The block-mean RGB grid (T, gh, gw, 3); features made without one get the thumbnails'."""
    if feats.grid is not None:
        return feats.grid
    if feats.thumbs is not None:
        return feats.thumbs.astype(np.float32)
    return np.zeros((len(feats.hist), 1, 1, 3), np.float32)


def picture_change(feats: FrameFeatures) -> np.ndarray:
    """(T,) how much the picture changes from frame t - 1 to t (0 at t = 0), 0..1: the larger of
    the mean |luma step| and the mean |block-mean RGB step| (a cut between two shots of one
    brightness changes the colours)."""
    g = _grid(feats)  # (T, gh, gw, 3)
    out = np.zeros(len(g), np.float32)
    out[1:] = np.abs(g[1:] - g[:-1]).mean(axis=(1, 2, 3)) / 255.0
    return np.maximum(out, feats.dpix)


def true_runs(mask: np.ndarray) -> list[tuple[int, int]]:
    """[start, end) of the True runs of a boolean vector."""
    m = np.concatenate([[False], mask.astype(bool), [False]])
    d = np.flatnonzero(np.diff(m.astype(np.int8)))
    return [(int(a), int(b)) for a, b in zip(d[::2], d[1::2], strict=True)]


@dataclass(kw_only=True, slots=True)
class FixedStrideSplitter:
    """Consecutive windows of `stride_s` seconds (the last one shorter), under the length rules."""

    stride_s: float = 10.0
    """Window length in seconds."""
    lengths: LengthRules = field(default_factory=lambda: LengthRules(min_len_s=0.0))
    """Min / max clip length rules (the stride already bounds the length)."""

    def split(self, source: FramesOrSource, *, fps: float | None = None) -> list[Span]:
        return self.segment(source, fps=fps).spans

    def segment(self, source: FramesOrSource, *, fps: float | None = None) -> Segmentation:
        fps_ = fps_of(source, fps)
        if isinstance(source, np.ndarray):
            n = len(source)
        else:
            n = probe(source).n_frames
        step = max(1, int(round(self.stride_s * fps_)))
        windows = [(a, min(a + step, n)) for a in range(0, n, step)]
        spans, short = self.lengths.partition(windows, fps_)
        return segmentation(spans, short, n, fps_)
