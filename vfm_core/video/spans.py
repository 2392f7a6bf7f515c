"""Splitter results: `Span` (a half-open frame range [start_frame, end_frame) with its times),
`DroppedSpan` (a range in no span, with its reason) and `Segmentation` (both, ordered, together
covering every frame once); `LengthRules` (min / max clip length, shared by every splitter) and the
helpers that build them.

Span times come from the decoded frame timestamps (exact for variable frame rate), or frame / fps
for arrays.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, TypeVar

import numpy as np

if TYPE_CHECKING:
    from vfm_core.video.io import DecodeGap


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


_S = TypeVar("_S", bound=Span)


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
                s = timed_span(a, b, fps, times)
                short.append(dropped_span(s, self.short_reason(s)))
                continue
            k = 1 if max_f is None else -(-n // max_f)
            edges = [a + (n * i) // k for i in range(k + 1)]
            out += [
                timed_span(s, e, fps, times) for s, e in zip(edges[:-1], edges[1:], strict=True)
            ]
        return out, short

    def short_reason(self, span: Span) -> str:
        return f"shot {span.duration_s:.2f} s < min {self.min_len_s:.2f} s"


def timed_span(start: int, end: int, fps: float, times: np.ndarray | None) -> Span:
    if times is None or len(times) == 0:
        return Span.of(start, end, fps)
    t_end = float(times[end]) if end < len(times) else float(times[-1]) + 1.0 / fps
    return Span(start_frame=start, end_frame=end, start_s=float(times[start]), end_s=t_end)


def dropped_span(span: Span, reason: str) -> DroppedSpan:
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
            rest.append(dropped_span(timed_span(pos, a, fps, times), other))
        pos = max(pos, b)
    dropped = sorted([*dropped, *rest], key=lambda d: d.start_frame)
    return Segmentation(spans=spans, dropped=dropped, n_frames=n_frames)


def transitions_from_spans(spans: list[Span]) -> list[tuple[int, int]]:
    """Boundaries between consecutive spans as intervals (end_i, start_i+1): (c, c) for a cut."""
    return [(a.end_frame, b.start_frame) for a, b in zip(spans[:-1], spans[1:], strict=True)]


def cut_at_gaps(seg: Segmentation, gaps: Sequence[DecodeGap], lengths: LengthRules) -> Segmentation:
    """`seg` with each break the decode found (`io.DecodeGap`: damaged bytes skipped, joined
    recordings, a picture size switch) made a boundary: a span or dropped range across one is
    split there, each side ending or starting at the gap's edge (a span piece under
    `lengths.min_len_s` is dropped as a short shot), and the gap's seconds, if any, are a
    zero-frame range with the gap's reason, so every second stays accounted for."""
    spans: list[Span] = list(seg.spans)
    dropped: list[DroppedSpan] = list(seg.dropped)
    for g in gaps:
        k, a, b = g.frame, g.start_s, g.end_s
        kept: list[Span] = []
        for s in spans:
            for piece in _split_at(s, k, a, b):
                if piece.duration_s < lengths.min_len_s:
                    dropped.append(dropped_span(piece, lengths.short_reason(piece)))
                else:
                    kept.append(piece)
        spans = kept
        dropped = [p for d in dropped for p in _split_at(d, k, a, b)]
        if b > a:  # seconds lost (a size change loses none: only the boundary)
            gap = DroppedSpan(start_frame=k, end_frame=k, start_s=a, end_s=b, reason=g.reason)
            dropped.append(gap)
    spans.sort(key=lambda s: s.start_frame)
    dropped.sort(key=lambda d: (d.start_frame, d.start_s))
    return Segmentation(spans=spans, dropped=dropped, n_frames=seg.n_frames)


def _split_at(span: _S, k: int, a: float, b: float) -> list[_S]:
    """`span` cut at frame `k`, the gap's seconds [a, b) taken out of it: two pieces when it
    holds frames on both sides, else itself, its seconds clipped to the side it is on."""
    if span.end_frame <= k and span.start_frame < k:  # before the gap
        return [replace(span, end_s=min(span.end_s, a))]
    if span.start_frame >= k and span.end_frame > k:  # after it
        return [replace(span, start_s=max(span.start_s, b))]
    if span.start_frame < k < span.end_frame:
        return [replace(span, end_frame=k, end_s=a), replace(span, start_frame=k, start_s=b)]
    return [span]  # a zero-frame range (another gap, a lost tail)
