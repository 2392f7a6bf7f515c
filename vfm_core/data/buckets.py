"""Resolution x duration buckets for unpacked training.

Without packing every batch must have one shape. Each sample goes to the bucket
(height, width, frames) whose aspect ratio is closest to its own (then the largest area and the
longest duration that do not exceed the sample, so clips are only cropped / resized down, never
up-sampled). :class:`BucketPlanner` walks the same global order as the plain planner and emits a
batch as soon as one bucket holds ``batch_size`` samples; its state (position + waiting positions
per bucket) is global, JSON, and restorable with any ``dp_size``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from vfm_core.data.plan import GlobalOrder

Bucket = tuple[int, int, int]  # (height, width, frames)


@dataclass(kw_only=True, slots=True)
class BucketSpec:
    """The allowed training shapes."""

    resolutions: tuple[tuple[int, int], ...] = ((256, 256), (192, 320), (320, 192))
    """(height, width) choices."""
    durations: tuple[int, ...] = (1, 17, 33, 65)
    """Frame counts (1 = image; 1 + 4k for the causal tokenizer)."""

    def buckets(self) -> list[Bucket]:
        return [(h, w, t) for h, w in self.resolutions for t in self.durations]


def assign_bucket(frames: int, height: int, width: int, spec: BucketSpec) -> int | None:
    """Index into ``spec.buckets()`` for a sample, or None when it is smaller than every shape."""
    aspect = np.log(width / height)
    best: tuple[float, int, int] | None = None
    choice = None
    for i, (h, w, t) in enumerate(spec.buckets()):
        if h > height or w > width or t > frames:
            continue
        score = (abs(np.log(w / h) - aspect), -h * w, -t)
        if best is None or score < best:
            best, choice = score, i
    return choice


class BucketPlanner:
    """Same-shape batches from the global order (drop-in for :class:`~.plan.Planner`)."""

    def __init__(
        self,
        order: GlobalOrder,
        bucket_of: Callable[[int], int | None],
        *,
        batch_size: int,
        n_buckets: int,
    ) -> None:
        self.order, self.bucket_of = order, bucket_of
        self.batch_size, self.n_buckets = batch_size, n_buckets
        self.position, self.steps, self.n_skipped = 0, 0, 0
        self.waiting: list[list[int]] = [[] for _ in range(n_buckets)]
        self.ready: list[list[int]] = []

    def _fill(self, need: int) -> None:
        while len(self.ready) < need:
            p = self.position
            self.position += 1
            b = self.bucket_of(self.order.sample(p))
            if b is None:
                self.n_skipped += 1
                continue
            self.waiting[b].append(p)
            if len(self.waiting[b]) == self.batch_size:
                self.ready.append(self.waiting[b])
                self.waiting[b] = []

    def next_step(self, dp_size: int) -> list[list[list[int]]]:
        self._fill(dp_size)
        batches, self.ready = self.ready[:dp_size], self.ready[dp_size:]
        self.steps += 1
        return [[b] for b in batches]

    @property
    def state(self) -> BucketPlanner:
        """Counters (``steps``, ``n_skipped``) under the same name as the plain planner's."""
        return self

    def state_dict(self) -> dict[str, Any]:
        return {
            "position": self.position,
            "steps": self.steps,
            "n_skipped": self.n_skipped,
            "waiting": [list(w) for w in self.waiting],
            "ready": [list(r) for r in self.ready],
        }

    def load_state_dict(self, d: dict[str, Any]) -> None:
        if len(d["waiting"]) != self.n_buckets:
            raise ValueError(
                f"bucket state has {len(d['waiting'])} buckets, spec has {self.n_buckets}"
            )
        self.position, self.steps = int(d["position"]), int(d["steps"])
        self.n_skipped = int(d["n_skipped"])
        self.waiting = [[int(p) for p in w] for w in d["waiting"]]
        self.ready = [[int(p) for p in r] for r in d["ready"]]
