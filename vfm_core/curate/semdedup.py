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

from dataclasses import dataclass

import numpy as np

from vfm_core.annotate.embed import l2_normalize


@dataclass(kw_only=True, slots=True)
class SemDedupConfig:
    """Near-duplicate removal over clip embeddings (off unless ``threshold`` is set)."""

    threshold: float | None = None
    """Cosine similarity at or above which a clip duplicates a kept one (None: off; 0.95 is a
    common choice, lower removes more)."""
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
