"""Splitter results: `Span` (a half-open frame range [start_frame, end_frame) with its times),
`DroppedSpan` (a range in no span, with its reason) and `Segmentation` (both, ordered, together
covering every frame once); `LengthRules` (min / max clip length, shared by every splitter) and the
helpers that build them.

Span times come from the decoded frame timestamps (exact for variable frame rate), or frame / fps
for arrays.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


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
                why = f"shot {s.duration_s:.2f} s < min {self.min_len_s:.2f} s"
                short.append(dropped_span(s, why))
                continue
            k = 1 if max_f is None else -(-n // max_f)
            edges = [a + (n * i) // k for i in range(k + 1)]
            out += [
                timed_span(s, e, fps, times) for s, e in zip(edges[:-1], edges[1:], strict=True)
            ]
        return out, short


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
