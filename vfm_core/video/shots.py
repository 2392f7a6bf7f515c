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

1. hard cuts: d1[t] is the maximum of [t-2, t+2] and exceeds both `cut_min` and `cut_ratio` x
   the rolling median of d1 over +-`window_s` (adaptive threshold);
2. gradual transitions (dissolves, fades): a run of >= `grad_min_frames` frames whose d1 is
   elevated (>= `grad_step` and >= `grad_ratio` x a longer rolling median) whose NET histogram
   change first -> last frame is >= `grad_min` and is "sustained": the frames k/2 before and after
   the run are stable relative to that change (motion keeps changing; a transition lands). Hard cut
   candidates inside a gradual run are its own steps and are absorbed;
3. black runs: >= `min_black_frames` frames whose 98th-percentile luma is below `black_level`.

All of it is vectorised numpy over (T, bins) arrays; decoding dominates the cost. Span times come
from the decoded frame timestamps (exact for variable frame rate), or frame / fps for arrays.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import numpy as np

from vfm_core.video.io import SKIP_LOOP_FILTER, Source, iter_frames, probe

FramesOrSource = Source | np.ndarray


@dataclass(kw_only=True, slots=True, frozen=True)
class Span:
    """A clip candidate: frames [start_frame, end_frame) = seconds [start_s, end_s)."""

    start_frame: int
    end_frame: int
    start_s: float
    end_s: float

    @property
    def n_frames(self) -> int:
        return self.end_frame - self.start_frame

    @property
    def duration_s(self) -> float:
        return self.end_s - self.start_s

    @classmethod
    def of(cls, start: int, end: int, fps: float) -> Span:
        return cls(start_frame=start, end_frame=end, start_s=start / fps, end_s=end / fps)


@dataclass(kw_only=True, slots=True, frozen=True)
class DroppedSpan(Span):
    """Frames [start_frame, end_frame) that are in no span, and why (a curation reject row)."""

    reason: str
    """E.g. "shot 1.20 s < min 2.00 s", "gradual transition (dissolve / fade)", "black"."""


@dataclass(kw_only=True, slots=True)
class Segmentation:
    """A splitter's full answer: kept spans and dropped ranges, each ordered, together covering
    frames [0, n_frames) exactly once."""

    spans: list[Span]
    """Clip candidates."""
    dropped: list[DroppedSpan]
    """Everything else, with its reason."""
    n_frames: int
    """Frames the splitter saw."""


@runtime_checkable
class Splitter(Protocol):
    """Anything that splits a video into ordered, non-overlapping `Span`s."""

    def split(self, source: FramesOrSource, *, fps: float | None = None) -> list[Span]:
        """Spans of `source` (a path / file object, or RGB uint8 frames (T, H, W, 3) + `fps`)."""
        ...

    def segment(self, source: FramesOrSource, *, fps: float | None = None) -> Segmentation:
        """`split`'s spans plus every dropped range with its reason."""
        ...


@dataclass(kw_only=True, slots=True)
class LengthRules:
    """Clip length limits shared by every splitter."""

    min_len_s: float = 2.0
    """Spans shorter than this are dropped (0 keeps all)."""
    max_len_s: float | None = 60.0
    """Longer spans are cut into equal windows no longer than this (None: no limit)."""

    def apply(
        self, spans: list[tuple[int, int]], fps: float, times: np.ndarray | None = None
    ) -> list[Span]:
        """Drop short spans, window long ones; seconds from `times` (T,) (exact for VFR) or fps."""
        return self.partition(spans, fps, times)[0]

    def partition(
        self, spans: list[tuple[int, int]], fps: float, times: np.ndarray | None = None
    ) -> tuple[list[Span], list[DroppedSpan]]:
        """`apply`'s spans, and the shots it dropped as too short (with the reason)."""
        min_f = int(math.ceil(self.min_len_s * fps - 1e-6))
        max_f = None if self.max_len_s is None else max(1, int(self.max_len_s * fps + 1e-6))
        out: list[Span] = []
        short: list[DroppedSpan] = []
        for a, b in spans:
            n = b - a
            if n <= 0:
                continue
            if n < min_f:
                s = _span(a, b, fps, times)
                why = f"shot {s.duration_s:.2f} s < min {self.min_len_s:.2f} s"
                short.append(_dropped(s, why))
                continue
            k = 1 if max_f is None else -(-n // max_f)
            edges = [a + (n * i) // k for i in range(k + 1)]
            out += [_span(s, e, fps, times) for s, e in zip(edges[:-1], edges[1:], strict=True)]
        return out, short


def _span(start: int, end: int, fps: float, times: np.ndarray | None) -> Span:
    if times is None or len(times) == 0:
        return Span.of(start, end, fps)
    t_end = float(times[end]) if end < len(times) else float(times[-1]) + 1.0 / fps
    return Span(start_frame=start, end_frame=end, start_s=float(times[start]), end_s=t_end)


def _dropped(span: Span, reason: str) -> DroppedSpan:
    return DroppedSpan(
        start_frame=span.start_frame,
        end_frame=span.end_frame,
        start_s=span.start_s,
        end_s=span.end_s,
        reason=reason,
    )


def segmentation(
    spans: list[Span],
    dropped: list[DroppedSpan],
    n_frames: int,
    fps: float,
    times: np.ndarray | None = None,
    *,
    other: str = "in no shot",
) -> Segmentation:
    """Sorted spans and dropped ranges; any frames still in neither become a dropped range with
    reason `other`, so the result covers [0, n_frames) exactly."""
    dropped = sorted(dropped, key=lambda d: d.start_frame)
    taken = sorted([(s.start_frame, s.end_frame) for s in [*spans, *dropped]])
    pos, rest = 0, []
    for a, b in [*taken, (n_frames, n_frames)]:
        if a > pos:
            rest.append(_dropped(_span(pos, a, fps, times), other))
        pos = max(pos, b)
    dropped = sorted([*dropped, *rest], key=lambda d: d.start_frame)
    return Segmentation(spans=spans, dropped=dropped, n_frames=n_frames)


def transitions_from_spans(spans: list[Span]) -> list[tuple[int, int]]:
    """Boundaries between consecutive spans as intervals (end_i, start_i+1): (c, c) for a cut."""
    return [(a.end_frame, b.start_frame) for a, b in zip(spans[:-1], spans[1:], strict=True)]


# --- features -------------------------------------------------------------------------------

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
    """HSV bin of every 24-bit RGB colour (16 MiB, built once per process in ~0.5 s)."""
    global _BIN_LUT
    if _BIN_LUT is None:
        lut = np.empty(1 << 24, np.uint8)
        gb = np.arange(1 << 16, dtype=np.int32)
        g, b = gb >> 8, gb & 255
        for r in range(256):
            rgb = np.stack([np.full_like(g, r), g, b], axis=-1)  # (65536, 3)
            lut[r << 16 : (r + 1) << 16] = _hsv_bins(rgb)
        _BIN_LUT = lut
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


def _luma(frames: np.ndarray) -> np.ndarray:
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


class _FeatureAccumulator:
    """Streams frame chunks into `FrameFeatures` (keeps only the previous frame's luma)."""

    def __init__(self) -> None:
        self.hist: list[np.ndarray] = []
        self.dpix: list[np.ndarray] = []
        self.bright: list[np.ndarray] = []
        self.thumbs: list[np.ndarray] = []
        self.times: list[float] = []
        self.prev: np.ndarray | None = None

    def add(self, frames: np.ndarray, times: list[float] | None = None) -> None:
        if times is not None:
            self.times += times
        y = _luma(frames)  # (B, H, W)
        self.hist.append(hsv_histograms(frames))
        self.thumbs.append(thumbnails(frames))
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
        )


def _chunks(
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
    buf: list[np.ndarray] = []
    ts: list[float] = []
    frames = iter_frames(
        source, width=width, resize="sample", threads=threads, decoder_options=decoder_options
    )
    for t, a in frames:
        buf.append(a)
        ts.append(t)
        if len(buf) == chunk:
            yield np.stack(buf), ts
            buf, ts = [], []
    if buf:
        yield np.stack(buf), ts


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
    acc = _FeatureAccumulator()
    for c, ts in _chunks(source, width, chunk, threads, decoder_options):
        acc.add(c, ts)
    return acc.result()


def _fps_of(source: FramesOrSource, fps: float | None) -> float:
    if fps is not None:
        return float(fps)
    if isinstance(source, np.ndarray):
        raise ValueError("fps is required when splitting an array of frames")
    return probe(source).fps


# --- rolling statistics -----------------------------------------------------------------------


def _rolling(x: np.ndarray, half: int, fn) -> np.ndarray:
    """fn over the centred window [t - half, t + half] (edge-padded) -> same shape as x."""
    if x.size == 0:
        return x.copy()
    p = np.pad(x, half, mode="edge")
    return fn(np.lib.stride_tricks.sliding_window_view(p, 2 * half + 1), axis=-1)


def _local_max(x: np.ndarray, half: int) -> np.ndarray:
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
    window_s: float = 1.0
    """Half-width of the rolling median window, seconds."""
    grad_step: float = 0.04
    """A frame-to-frame distance at least this large can be part of a gradual transition."""
    grad_ratio: float = 2.0
    """... and it must exceed this times the rolling median (window 2 x `window_s`)."""
    grad_gap: int = 2
    """Quiet frames (at most this many) inside a run of elevated change do not end it."""
    grad_min_frames: int = 4
    """Shortest run of elevated change that counts as gradual (a hard cut is 1-2 frames)."""
    grad_min: float = 0.35
    """Net histogram distance across a gradual transition (0..1)."""
    grad_k: int = 16
    """Stability check: frames compared on each side of a gradual transition are k/2 apart."""
    grad_stable: float = 0.4
    """The change just outside a transition must be below this fraction of its net change."""
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
        fps_ = _fps_of(source, fps)
        feats = self._features(source)
        return self.segmentation(self.detect(feats, fps_), fps_, times=feats.times)

    def split_features(
        self, source: FramesOrSource, *, fps: float | None = None
    ) -> tuple[list[Span], FrameFeatures]:
        """`split`, also returning the per-frame features (stitching reuses them: no re-decode)."""
        fps_ = _fps_of(source, fps)
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
                span = _span(max(a, pos), b, fps, times)
                dropped.append(_dropped(span, "gradual transition (dissolve / fade)"))
            pos = max(pos, b)
        if pos < det.n_frames:
            raw.append((pos, det.n_frames))
        if self.drop_black:
            bset = set(black)
            dropped += [
                _dropped(_span(a, b, fps, times), "black segment") for a, b in raw if (a, b) in bset
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
        is_cut = (d1 >= self.cut_min) & (d1 >= self.cut_ratio * (base + eps)) & _local_max(d1, 2)
        is_cut[0] = False
        cuts = np.flatnonzero(is_cut).tolist()

        # black runs
        dark = feats.bright < self.black_level
        black: list[tuple[int, int]] = []
        for a, b in _runs(dark):
            if b - a >= self.min_black_frames:
                black.append((a, b))
        # cuts at (or inside) black runs are the runs' edges
        cuts = [c for c in cuts if not any(a - 2 <= c <= b + 2 for a, b in black)]

        gradual = self._gradual(h, d1, black, w)
        # cut candidates inside a gradual transition are the transition's own steps
        cuts = [c for c in cuts if not any(a - 2 <= c <= b + 2 for a, b in gradual)]
        return Detection(n_frames=t_n, cuts=cuts, gradual=gradual, black=black, score=d1)

    def _gradual(
        self, h: np.ndarray, d1: np.ndarray, black: list[tuple[int, int]], w: int
    ) -> list[tuple[int, int]]:
        """Runs of elevated frame-to-frame change with a large, sustained net change."""
        t_n = h.shape[0]
        m = max(1, self.grad_k // 2)
        base = _rolling(d1, 2 * w, np.median)  # (T,) long window: a fade must not raise it
        hot = (d1 >= self.grad_step) & (d1 >= self.grad_ratio * (base + 0.005))
        hot[0] = False
        runs = _runs(_close_gaps(hot, self.grad_gap))
        out: list[tuple[int, int]] = []
        for a, b in runs:
            if b - a < self.grad_min_frames:
                continue
            first, last = a - 1, b - 1  # last clean frame before, first clean frame after
            net = 0.5 * float(np.abs(h[last] - h[first]).sum())
            if net < self.grad_min:
                continue
            before = 0.5 * float(np.abs(h[first] - h[max(0, first - m)]).sum())
            after = 0.5 * float(np.abs(h[min(t_n - 1, last + m)] - h[last]).sum())
            if max(before, after) > self.grad_stable * net:
                continue  # still changing on either side: motion, not a transition
            if any(x - 2 <= first and last <= y + 2 for x, y in black):
                continue
            out.append((a, max(a, last)))  # blended frames [a, last)
        return out


def _close_gaps(mask: np.ndarray, gap: int) -> np.ndarray:
    """Fill False runs of length <= gap that lie between True values."""
    out = mask.copy()
    for a, b in _runs(~mask):
        if b - a <= gap and a > 0 and b < len(mask):
            out[a:b] = True
    return out


def _runs(mask: np.ndarray) -> list[tuple[int, int]]:
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
        fps_ = _fps_of(source, fps)
        if isinstance(source, np.ndarray):
            n = len(source)
        else:
            n = probe(source).n_frames
        step = max(1, int(round(self.stride_s * fps_)))
        windows = [(a, min(a + step, n)) for a in range(0, n, step)]
        spans, short = self.lengths.partition(windows, fps_)
        return segmentation(spans, short, n, fps_)
