"""Semantic deduplication of curated clips (SemDeDup: Abbas et al. 2023, "SemDeDup: Data-efficient
learning at web-scale through semantic deduplication").

The clip embeddings (L2-normalised) are clustered with k-means (k-means++ seeding, fixed seed);
inside each cluster, clips are visited from the least to the most typical (cosine to the centroid
ascending, then clip id: deterministic) and a clip whose cosine similarity to a clip already kept
in the cluster is at least ``threshold`` is removed, its reject naming the kept clip it duplicates
and the similarity. Pairs are only compared inside a cluster: O(sum of cluster sizes^2) instead of
O(N^2), the approximation the paper makes.

It runs on the assembled manifest, after any executor (in-process or Ray) produced the clips, so
both executors dedup identically.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from vfm_core.annotate.vectors import l2_normalize
from vfm_core.config_fields import bounds

COLOR_THUMB_THRESHOLD = 0.995
"""Calibrated cosine for the built-in colour embedding (`ColorThumbEmbedder`; ``--semdedup``
without a value). Measured on real footage (clip embeddings as curation computes them: 4 frames
of the 8 fps samples at 64 px): the 37 shots the curation defaults cut from TransNetV2's music
video (shots of a few sets, repeated framings) have a nearest distinct shot at cosine 0.81-0.994
(median 0.945; with bikes' and bigbuckbunny's shots, 17 of 41 have a distinct shot at >= 0.95),
while true near-duplicates of the same shots score: re-encoded at crf 38 0.92-0.990 (median
0.975), cropped 5 % a side 0.88-0.992 (median 0.984), 25 % time-shifted overlap 0.958-0.998
(median 0.989). The distributions overlap: a colour statistic cannot tell a repeated set-up
from a copy, so the default sits above every distinct shot measured (0.994) and removes only the
closest copies (about a quarter of the time-shifted overlaps; a crf 18 re-encode of one shot
scored 0.991 against its source span, below a repeated set-up's 0.994). Use a visual model
(`CurateConfig.image_model`, a local directory) with a threshold measured for it to remove more."""


def default_threshold(image_model: str | None) -> float:
    """The calibrated threshold for the clip embedding in use: `COLOR_THUMB_THRESHOLD` for the
    colour embedding; a model's cosines live on another scale, so it needs one measured for it."""
    if image_model is not None:
        raise ValueError(
            f"semdedup: no calibrated threshold for the image model {image_model!r}; give the "
            "cosine measured for it (e.g. --semdedup 0.9); the default "
            f"{COLOR_THUMB_THRESHOLD} is for the colour embedding"
        )
    return COLOR_THUMB_THRESHOLD


@dataclass(kw_only=True, slots=True)
class SemDedupConfig:
    """Near-duplicate removal over clip embeddings (off unless ``threshold`` is set)."""

    threshold: float | None = field(default=None, metadata=bounds(gt=0, le=1))
    """Cosine similarity at or above which a clip duplicates a kept one (SemDeDup; None: off;
    lower removes more). For the colour embedding use `COLOR_THUMB_THRESHOLD` (0.995): at 0.95,
    17 of 41 distinct real shots have another distinct shot at or above it."""
    clusters: int | None = None
    """k of k-means (None: about sqrt(N / 2), at least 1)."""
    iterations: int = 25
    """k-means iterations (Lloyd)."""
    seed: int = 0
    """Seed of the k-means++ initialisation."""

    def __post_init__(self) -> None:
        if self.threshold is not None and not 0.0 < self.threshold <= 1.0:
            raise ValueError(f"semdedup threshold must be in (0, 1], got {self.threshold}")
        if self.clusters is not None and self.clusters < 1:
            raise ValueError(f"semdedup clusters must be >= 1, got {self.clusters}")


@dataclass(kw_only=True, slots=True, frozen=True)
class Duplicate:
    """A removed clip and the kept clip it duplicates."""

    index: int
    """Row of the removed clip in the input."""
    kept: int
    """Row of the kept clip it duplicates."""
    cosine: float


def kmeans(x: np.ndarray, k: int, *, iterations: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Spherical k-means of unit rows x (N, D): (labels (N,), centroids (k, D) unit)."""
    rng = np.random.default_rng(seed)
    n = len(x)
    k = min(k, n)
    centres = [x[rng.integers(n)]]
    for _ in range(1, k):  # k-means++: next centre with probability ~ squared distance
        d2 = np.min(2.0 - 2.0 * x @ np.stack(centres).T, axis=1).clip(min=0)  # (N,)
        total = d2.sum()
        centres.append(x[rng.choice(n, p=d2 / total)] if total > 0 else x[rng.integers(n)])
    c = np.stack(centres)  # (k, D)
    labels = np.zeros(n, dtype=np.int64)
    for _ in range(iterations):
        labels_new = np.argmax(x @ c.T, axis=1)  # (N,) nearest by cosine
        for j in range(k):
            members = x[labels_new == j]
            if len(members):
                m = members.sum(0)
                c[j] = l2_normalize(m)
        if np.array_equal(labels_new, labels):
            break
        labels = labels_new
    return labels, c


def find_duplicates(embeddings: np.ndarray, ids: list[str], cfg: SemDedupConfig) -> list[Duplicate]:
    """The clips to remove from ``embeddings`` (N, D), each with the kept clip it duplicates;
    ``ids`` (clip ids) break ties so the result does not depend on row order."""
    if cfg.threshold is None or len(embeddings) < 2:
        return []
    x = np.asarray(embeddings, dtype=np.float64)
    if x.ndim != 2 or len(ids) != len(x):
        raise ValueError(
            f"semdedup: embeddings must be (N, D) with N ids, got {x.shape}, {len(ids)} ids"
        )
    x = l2_normalize(x)  # (N, D) unit rows
    k = cfg.clusters or max(1, round(np.sqrt(len(x) / 2)))
    labels, centres = kmeans(x, k, iterations=cfg.iterations, seed=cfg.seed)
    out: list[Duplicate] = []
    for j in range(len(centres)):
        members = np.flatnonzero(labels == j)
        typical = x[members] @ centres[j]  # (m,) cosine to the centroid
        order = sorted(
            range(len(members)), key=lambda i: (round(float(typical[i]), 9), ids[members[i]])
        )
        kept: list[int] = []
        for i in order:
            row = int(members[i])
            if kept:
                sims = x[kept] @ x[row]  # (kept,)
                best = int(np.argmax(sims))
                if sims[best] >= cfg.threshold:
                    out.append(Duplicate(index=row, kept=kept[best], cosine=float(sims[best])))
                    continue
            kept.append(row)
    return sorted(out, key=lambda d: d.index)
