"""Weighted blending of datasets.

:class:`BlendedLoader` draws, for every step, which dataset the step comes from with
probability ``weights[d]`` from ``(seed, step)``: proportions are exact in expectation, every DP
rank draws the same dataset at the same step, and the state is the step count, the samples drawn
from each dataset (over all DP ranks) and each loader's own state. Training from a blend
(``data.blend``) is :class:`~vfm_core.data.shard_source.ShardLatentSource` over one loader per
dataset; where loader positions key counter-based draws (packed training), dataset ``d``'s are
offset by ``d * POSITION_STRIDE`` so the keys stay unique over the datasets. (Same-shape batches
for unpacked training: :mod:`vfm_core.data.buckets`.)
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import numpy as np

from vfm_core.data.loader import LoaderStateError

POSITION_STRIDE = 1 << 40
"""Offset between the draw keys of two datasets of a blend (2**40 ~ 1.1e12 positions each)."""


def dataset_names(urls: Sequence[str]) -> list[str]:
    """Unique metric-safe names of dataset directories: the basename (``s3://b/web/`` -> ``web``)
    with characters other than ``[A-Za-z0-9_.-]`` as ``_``; a repeated name gets ``_2``, ``_3``."""
    names: list[str] = []
    for url in urls:
        base = re.sub(r"[^A-Za-z0-9_.-]", "_", url.rstrip("/").rsplit("/", 1)[-1]) or "dataset"
        name, k = base, 2
        while name in names:
            name, k = f"{base}_{k}", k + 1
        names.append(name)
    return names


class BlendedLoader:
    """Steps drawn from several loaders with given weights (see the module docstring).
    ``names``: one per loader, for messages and per-dataset counts (default "0", "1", ...)."""

    def __init__(
        self,
        loaders: Sequence[Any],
        weights: Sequence[float],
        *,
        seed: int,
        names: Sequence[str] | None = None,
    ) -> None:
        w = np.asarray(weights, dtype=np.float64)
        if len(loaders) != len(w) or len(w) == 0:
            raise ValueError(f"{len(loaders)} loaders but {len(w)} weights")
        if (w < 0).any() or not np.isfinite(w).all() or w.sum() <= 0:
            raise ValueError(f"blend weights must be finite, >= 0 and not all 0, got {list(w)}")
        self.loaders, self.probs, self.seed = list(loaders), w / w.sum(), seed
        self.names = [str(i) for i in range(len(w))] if names is None else list(names)
        self.cdf = np.cumsum(self.probs)
        self.step = 0
        self.samples = [0] * len(self.loaders)
        """Samples drawn from each dataset so far, over all data-parallel ranks."""

    def choice(self, step: int) -> int:
        """Dataset of global step ``step``: a pure function of (seed, step)."""
        u = np.random.Generator(np.random.PCG64([self.seed, 0xB1E, step])).random()
        return int(min(np.searchsorted(self.cdf, u, side="right"), len(self.cdf) - 1))

    def next_batch(self):
        d = self.choice(self.step)
        self.step += 1
        batch = self.loaders[d].next_batch()
        batch.source = d
        self.samples[d] += batch.global_samples
        return batch

    def __iter__(self):
        while True:
            yield self.next_batch()

    def state_dict(self) -> dict[str, Any]:
        return {
            "version": 1,
            "kind": "blend",
            "seed": self.seed,
            "step": self.step,
            "weights": self.probs.tolist(),
            "names": self.names,
            "samples": list(self.samples),
            "loaders": [ld.state_dict() for ld in self.loaders],
        }

    def _describe(self, state: dict[str, Any]) -> str:
        pairs = zip(state.get("names") or [], state.get("weights") or [])
        return f"seed/weights {state.get('seed')}/" + ",".join(f"{n}:{w:.4g}" for n, w in pairs)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore; a state of another blend (seed, weights, datasets or their number) or not of
        a blend is refused in one line (a :class:`~vfm_core.data.loader.LoaderStateError`)."""
        if state.get("kind") != "blend" or state.get("version") != 1:
            raise LoaderStateError(
                f"loader state kind={state.get('kind')!r} is not a blend of datasets (kind "
                f"'blend', version 1); this run blends {len(self.loaders)} (data.blend)"
            )
        ours, theirs = self.state_dict(), state.get("loaders", [])
        same = (
            state.get("seed") == self.seed
            and len(theirs) == len(state.get("weights", [])) == len(self.probs)
            and np.allclose(state["weights"], self.probs)
            and [s.get("dataset") for s in theirs] == [s.get("dataset") for s in ours["loaders"]]
        )
        if not same:
            raise LoaderStateError(
                f"loader state belongs to another blend ({self._describe(state)}; this run "
                f"{self._describe(ours)}, datasets compared by content): resume with the "
                "data.blend and data.seed it was saved with"
            )
        self.step = int(state["step"])
        self.samples = [int(n) for n in state.get("samples", self.samples)]
        for ld, s in zip(self.loaders, state["loaders"]):
            ld.load_state_dict(s)
