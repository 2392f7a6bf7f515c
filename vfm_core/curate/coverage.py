"""Every second accounted for: each probed input's duration is covered by its clips and rejects.

A clip row covers [start_s, end_s) of its source; so does a reject row, and a reject without
times (an input that could not be read) covers the whole input. A truncated or damaged file is
curated as far as it decodes; the lost tail is one reject row up to the duration the container
states, and a file where no frame decodes is one reject of that duration (counted in
`seconds`, though it is in no videos manifest). `coverage_gaps` lists what neither covers,
beyond a tolerance of a frame or two at boundaries (frame timestamps and stated stream durations
differ by that much). The curation run checks it after assembling the manifests; the tests check
it on every run.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import polars as pl

Rows = pl.DataFrame | Iterable[Mapping[str, Any]]
"""Manifest rows: a DataFrame or dicts with source_uri, start_s, end_s."""


@dataclass(kw_only=True, slots=True, frozen=True)
class Gap:
    """Seconds [start_s, end_s) of an input in no clip and no reject row."""

    source_uri: str
    start_s: float
    end_s: float

    def __str__(self) -> str:
        return f"{self.source_uri} {self.start_s:.3f}-{self.end_s:.3f} s"


def _rows(x: Rows) -> Iterable[Mapping[str, Any]]:
    return x.iter_rows(named=True) if isinstance(x, pl.DataFrame) else x


def coverage_gaps(
    clips: Rows,
    rejects: Rows,
    durations: Mapping[str, float],
    *,
    tol_s: float | Mapping[str, float] = 0.1,
) -> list[Gap]:
    """Uncovered ranges longer than `tol_s` (one value, or per source_uri) of each input in
    `durations` (source_uri -> seconds, e.g. from the videos manifest), sorted."""
    spans: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for r in _rows(clips):
        spans[r["source_uri"]].append((float(r["start_s"]), float(r["end_s"])))
    for r in _rows(rejects):
        uri, a, b = r["source_uri"], r.get("start_s"), r.get("end_s")
        if uri not in durations:
            continue
        if a is None or b is None:  # the whole input
            a, b = 0.0, durations[uri]
        spans[uri].append((float(a), float(b)))
    gaps = []
    for uri, dur in sorted(durations.items()):
        tol = tol_s[uri] if isinstance(tol_s, Mapping) else tol_s
        pos = 0.0
        for a, b in [*sorted(spans.get(uri, [])), (dur, dur)]:
            if a - pos > tol:
                gaps.append(Gap(source_uri=uri, start_s=pos, end_s=min(a, dur)))
            pos = max(pos, b)
    return gaps


def seconds(rows: Rows) -> float:
    """Total length of the rows with times (rows without times count 0)."""
    return float(
        sum(
            r["end_s"] - r["start_s"]
            for r in _rows(rows)
            if r.get("start_s") is not None and r.get("end_s") is not None
        )
    )
