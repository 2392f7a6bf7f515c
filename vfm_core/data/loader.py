"""The savable, rank-aware loader over shards: ``build_loader(shards=..., seed=..., ...)``.

Stage order of one step (see :mod:`vfm_core.data.plan` for the ordering rule): plan (global, from
the index only) → take this DP rank's groups → read the samples' byte ranges (model-parallel group:
each of k ranks reads 1/k and the group all-gathers the raw bytes) → checksum (the index's
per-sample sha256: flipped bytes in any member) → parse + check (tar member names, npy
dtype/shape/NaN) → decode the clip (optional; it must decode to the index's size and to the frames
its token grid or bucket needs) → :class:`Batch` (with a :class:`PackLayout` per pack when packing).
A sample failing any check is skipped for this rank only: one warning line naming its shard, key and
reason, counted in ``skipped_total`` and listed in ``Batch.skipped`` / ``Batch.skip_reasons``.
Reading, checking and decoding samples: :class:`~vfm_core.data.loader_reading.SampleReader`;
token grids, buckets and the dataset's extremes:
:class:`~vfm_core.data.loader_geometry.SampleGeometry` (both held by :class:`ShardLoader`).

Integrity (:func:`build_loader`'s ``verify``, ``"sample"`` by default): shard sizes at start and
every sample's checksum as it is read; its cost is measured in ``benchmarks/loader.py``. An index
without per-sample checksums (older vfm) falls back to every shard's sha256 at start (datasets up
to :data:`FULL_CHECK_BYTES`) or to sizes, and says so once; an index whose shard table was edited
after it was written gets every shard's sha256 checked before it is read.

``state_dict()`` is a small versioned JSON dict: dataset fingerprint, seed, packing parameters
and the planner's global state (position, buffer, queued packs). Restoring it in a new process
gives bit-identical batches; it is valid for any ``dp_size`` / ``num_workers``.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Literal

import numpy as np

from vfm_core.data.buckets import BucketPlanner, BucketSpec
from vfm_core.data.index import read_index
from vfm_core.data.index_tables import DatasetIndex
from vfm_core.data.loader_geometry import SampleGeometry
from vfm_core.data.loader_reading import SampleReader
from vfm_core.data.plan import GlobalOrder, Planner
from vfm_core.data.shard_batch import Batch, Sample
from vfm_core.data.shard_reader import SampleError, verify_shards
from vfm_core.errors import UserError
from vfm_core.geometry import Grid, PackLayout

STATE_VERSION = 2
"""2: the global order is a Feistel permutation (v1 states, a materialised permutation, are
refused in one line)."""
log = logging.getLogger(__name__)
FULL_CHECK_BYTES = 2 << 30
"""An index without per-sample checksums: up to this many shard bytes are sha256-checked at
start (a few seconds locally), beyond it only their sizes."""
_told: set[str] = set()  # datasets whose missing per-sample checksums were reported


class LoaderStateError(UserError, ValueError):
    """A loader state that does not belong to this dataset / configuration."""


class NoSampleFitsError(UserError, ValueError):
    """No sample of the dataset fits the packing budget or any bucket shape; the message names
    the dataset and the sizes, ``largest`` is the biggest sample's (frames, height, width)."""

    def __init__(self, message: str, *, largest: tuple[int, int, int]) -> None:
        super().__init__(message)
        self.largest = largest


def _refuse_bad_sizes(
    *, dp_rank: int, dp_size: int, batch_size: int, num_workers: int, max_tokens: int | None
) -> None:
    """ValueError for a rank outside the data-parallel group or a size out of range."""
    if not 0 <= dp_rank < dp_size:
        raise ValueError(f"dp_rank={dp_rank} must be in [0, dp_size={dp_size})")
    if batch_size < 1:
        raise ValueError(f"batch_size={batch_size} must be >= 1")
    if num_workers < 0:
        raise ValueError(f"num_workers={num_workers} must be >= 0")
    if max_tokens is not None and max_tokens < 1:
        raise ValueError(f"max_tokens={max_tokens} must be positive or None")


def _batch_planner(
    order: GlobalOrder,
    geometry: SampleGeometry,
    *,
    root: str,
    batch_size: int,
    max_tokens: int | None,
    buckets: BucketSpec | None,
    buffer_size: int,
    slack: float,
) -> Planner | BucketPlanner:
    """The planner of the steps' batches: same-shape batches of ``buckets``, else packs of at
    most ``max_tokens`` (or ``batch_size`` samples). NoSampleFitsError when no sample of the
    dataset at ``root`` fits a pack or a bucket."""
    if max_tokens is not None and (fewest := geometry.token_extremes()[0]) > max_tokens:
        raise NoSampleFitsError(
            f"max_tokens={max_tokens}: no sample of the dataset fits ({root}: the "
            f"smallest sample has {fewest} tokens)",
            largest=geometry.largest_sample(),
        )
    if buckets is None:
        return Planner(
            order,
            geometry.tokens,
            batch_size=batch_size,
            max_tokens=max_tokens,
            buffer_size=buffer_size,
            slack=slack,
        )
    if max_tokens is not None:
        raise ValueError("buckets are for unpacked training: pass max_tokens=None")
    if not geometry.any_bucket_fits():
        f, h, w = geometry.largest_sample()
        shapes = ", ".join(f"{t} frames of {bh}x{bw}" for bh, bw, t in geometry.bucket_list)
        raise NoSampleFitsError(
            f"{root}: every sample is smaller than every bucket shape (the largest "
            f"sample is {f} frames of {h}x{w} px (HxW); buckets: {shapes})",
            largest=(f, h, w),
        )
    return BucketPlanner(
        order, geometry.bucket_of, batch_size=batch_size, n_buckets=len(geometry.bucket_list)
    )


class ShardLoader:
    """Iterable loader; see the module docstring. Use :func:`build_loader`.

    ``batch_size``: samples (unpacked) or packs (``max_tokens``) per step and DP rank. ``decode``:
    ``"frames"`` decodes clips to uint8 (T, H, W, 3) unless the shard has latents; ``"none"`` hands
    out the encoded mp4. ``patch`` / ``compression``: turn a sample's geometry into its token grid
    (for packing). ``buffer_size`` / ``slack``: packing buffer and fill target. ``on_error``: skip
    (count, log) or raise on a bad sample. ``mp_group``: model-parallel group that reads 1/k each
    and all-gathers. ``buckets``: same-shape batches (unpacked). ``prefetch``: steps built ahead in
    a background thread (not with ``mp_group``); never changes batches or state. ``checksums``:
    check every sample against its checksum in the index (where it has one).

    ``geometry`` answers token grids, buckets and the dataset's extremes; ``reader`` reads,
    checks and decodes the samples.
    """

    def __init__(
        self,
        index: DatasetIndex,
        *,
        seed: int,
        dp_rank: int = 0,
        dp_size: int = 1,
        num_workers: int = 0,
        max_tokens: int | None = None,
        batch_size: int = 1,
        decode: Literal["frames", "none"] = "frames",
        patch: Grid = (1, 2, 2),
        compression: Grid = (4, 8, 8),
        buffer_size: int = 64,
        slack: float = 0.03,
        on_error: Literal["skip", "raise"] = "skip",
        mp_group: Any = None,
        buckets: BucketSpec | None = None,
        prefetch: int = 0,
        checksums: bool = True,
    ) -> None:
        _refuse_bad_sizes(
            dp_rank=dp_rank,
            dp_size=dp_size,
            batch_size=batch_size,
            num_workers=num_workers,
            max_tokens=max_tokens,
        )
        self.index, self.seed = index, seed
        self.dp_rank, self.dp_size = dp_rank, dp_size
        self.num_workers, self.on_error = num_workers, on_error
        self.max_tokens, self.batch_size = max_tokens, batch_size
        self.buffer_size, self.slack = buffer_size, slack
        self.geometry = geometry = SampleGeometry(
            index, patch=patch, compression=compression, buckets=buckets
        )
        self._walked = 0  # positions the packer walked last step (what to prefetch next)
        self.order = GlobalOrder(len(index), seed)
        self.planner = _batch_planner(
            self.order,
            geometry,
            root=index.root,
            batch_size=batch_size,
            max_tokens=max_tokens,
            buckets=buckets,
            buffer_size=buffer_size,
            slack=slack,
        )
        self.skipped_total = 0
        self._pool = ThreadPoolExecutor(num_workers) if num_workers > 0 else None
        self.reader = SampleReader(
            index, geometry, decode=decode, checksums=checksums, mp_group=mp_group, pool=self._pool
        )
        if prefetch < 0:
            raise ValueError(f"prefetch={prefetch} must be >= 0")
        self.prefetch = prefetch
        self._ahead: deque[tuple[dict[str, Any], Future[Batch]]] = deque()
        # prefetch overlaps reading with training; collectives (mp_group) stay on the caller
        use = prefetch > 0 and mp_group is None
        self._ahead_pool = ThreadPoolExecutor(1, "vfm-prefetch") if use else None

    @property
    def bytes_read(self) -> int:
        """Bytes this rank has read (its share of a model-parallel group's reads)."""
        return self.reader.bytes_read

    # ------------------------------------------------------------------ iteration
    def _build(self, plan: list[list[int]], step: int, global_samples: int) -> Batch:
        """Read, check and decode the samples of one planned step (this rank's groups);
        ``global_samples``: those of the step over all ranks."""
        positions = [p for g in plan for p in g]
        ids = [self.order.sample(p) for p in positions]
        before = self.bytes_read
        raws = self.reader.read_all(ids)

        def load(j: int) -> Sample | SampleError:
            try:
                return self.reader.load(ids[j], raws[j], position=positions[j])
            except SampleError as e:
                if self.on_error == "raise":
                    raise
                return e

        js = range(len(positions))
        loaded = list(self._pool.map(load, js)) if self._pool else [load(j) for j in js]
        samples: list[Sample] = []
        where: dict[int, int] = {}
        skipped, reasons = [], []
        for j, s in enumerate(loaded):
            if isinstance(s, SampleError):
                skipped.append(s.where)
                reasons.append(str(s))
                log.warning("skipping bad sample: %s", s)
                continue
            where[j] = len(samples)
            samples.append(s)
        packs, members = None, []
        if self.max_tokens is not None:
            packs, j0 = [], 0
            for g in plan:
                keep = [where[j] for j in range(j0, j0 + len(g)) if j in where]
                j0 += len(g)
                members.append(keep)
                packs.append(
                    PackLayout.from_grids([samples[m].grid for m in keep], self.max_tokens)
                )
        return Batch(
            keys=[s.key for s in samples],
            samples=samples,
            packs=packs,
            pack_members=members,
            step=step,
            skipped=skipped,
            skip_reasons=reasons,
            bytes_read=self.bytes_read - before,
            global_samples=global_samples,
        )

    def _prefetch_grids(self) -> None:
        """Columnar index, packed: the grids of the positions the packer will likely walk this
        step (as many as last step, plus a margin), their row groups read in one call rather
        than one read per sample as the packer asks."""
        if not self.geometry.read_ahead or not isinstance(self.planner, Planner):
            return
        if self.max_tokens is None:
            return
        start = self.planner.state.position
        k = self._walked or self.dp_size * self.batch_size * 4 + self.buffer_size
        pos = np.arange(start, start + k + k // 4 + 8, dtype=np.int64)
        n = self.order.n
        ids = np.concatenate(
            [
                self.order.epoch_order(int(e)).map(pos[pos // n == e] % n)
                for e in np.unique(pos // n)
            ]
        )
        self.geometry.prefetch(ids)

    def _plan(self) -> tuple[dict[str, Any], tuple[list[list[int]], int, int]]:
        """(planner state before, (this rank's groups, step, samples of the step on all ranks))."""
        before = self.planner.state_dict()
        self._prefetch_grids()
        plans = self.planner.next_step(self.dp_size)  # plans[r]: rank r's groups of positions
        if isinstance(self.planner, Planner):
            self._walked = self.planner.state.position - before["position"]
        n = sum(len(g) for groups in plans for g in groups)
        return before, (plans[self.dp_rank], self.planner.state.steps, n)

    def next_batch(self) -> Batch:
        if self._ahead_pool is None:
            batch = self._build(*self._plan()[1])
        else:  # keep `prefetch` steps in flight; the state stays at the last delivered step
            while len(self._ahead) <= self.prefetch:
                before, planned = self._plan()
                self._ahead.append((before, self._ahead_pool.submit(self._build, *planned)))
            batch = self._ahead.popleft()[1].result()
        self.skipped_total += len(batch.skipped)
        return batch

    def _drop_prefetched(self) -> dict[str, Any] | None:
        """Wait for and discard prefetched steps; the planner state before the first of them."""
        first = self._ahead[0][0] if self._ahead else None
        for _, fut in self._ahead:
            fut.exception()  # wait; a failed prefetch is simply dropped
        self._ahead.clear()
        return first

    def __iter__(self) -> Iterator[Batch]:
        while True:
            yield self.next_batch()

    # ------------------------------------------------------------------ state
    def _fingerprint(self) -> dict[str, Any]:
        return {
            "dataset": self.index.fingerprint(),
            "seed": self.seed,
            "max_tokens": self.max_tokens,
            "batch_size": self.batch_size,
            "buffer_size": self.buffer_size,
            "slack": self.slack,
            "patch": list(self.geometry.patch),
            "compression": list(self.geometry.compression),
            "buckets": None
            if self.geometry.buckets is None
            else [list(b) for b in self.geometry.bucket_list],
        }

    def state_dict(self) -> dict[str, Any]:
        return {
            "version": STATE_VERSION,
            "kind": "shard_loader",
            **self._fingerprint(),
            "planner": self._ahead[0][0] if self._ahead else self.planner.state_dict(),
            "skipped_total": self.skipped_total,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("kind") == "blend":
            raise LoaderStateError(
                f"loader state is a blend of {len(state.get('loaders', []))} datasets "
                "(data.blend); this run reads one (data.shards): resume with that data.blend"
            )
        if state.get("version") != STATE_VERSION or state.get("kind") != "shard_loader":
            raise LoaderStateError(
                f"loader state kind={state.get('kind')!r} version={state.get('version')!r} is "
                f"not a shard loader state v{STATE_VERSION} (v1: written by an older vfm whose "
                "global order differs; resume it with that version or start the data afresh)"
            )
        ours = self._fingerprint()
        diff = [
            f"{k}: state {state.get(k)!r} vs loader {v!r}"
            for k, v in ours.items()
            if state.get(k) != v
        ]
        if diff:
            raise LoaderStateError(
                "loader state belongs to another dataset or configuration ("
                + "; ".join(diff)
                + "); dp_size and num_workers may change, these may not"
            )
        self._drop_prefetched()
        self.planner.load_state_dict(state["planner"])
        self.skipped_total = int(state.get("skipped_total", 0))

    def close(self) -> None:
        self._drop_prefetched()
        for pool in (self._pool, self._ahead_pool):
            if pool is not None:
                pool.shutdown(wait=False)


def build_loader(
    *,
    shards: str | DatasetIndex,
    seed: int = 0,
    dp_rank: int = 0,
    dp_size: int = 1,
    num_workers: int = 0,
    max_tokens: int | None = None,
    verify: Literal["sample", "sha256", "size", "none"] = "sample",
    **kwargs: Any,
) -> ShardLoader:
    """Savable loader over the shard directory ``shards`` (local or ``s3://``).

    ``max_tokens=None``: batches of ``batch_size`` samples; else ``batch_size`` packs of at most
    ``max_tokens`` tokens each. ``verify``: ``sample`` (default) checks shard sizes at start and
    every sample's checksum as it is read (see the module docstring for indexes without them);
    ``sha256`` also every shard's sha256 at start (reads the whole dataset); ``size`` only the
    sizes; ``none`` nothing. Further keywords: see :class:`ShardLoader`.
    """
    t0 = time.perf_counter()
    index = shards if isinstance(shards, DatasetIndex) else read_index(str(shards))
    if verify not in ("sample", "sha256", "size", "none"):
        raise ValueError(f"verify={verify!r}: one of sample, sha256, size, none")
    full = verify == "sha256" or (verify == "sample" and _needs_full_check(index))
    if verify != "none":
        verify_shards(index, checksum=full)
    loader = ShardLoader(
        index,
        seed=seed,
        dp_rank=dp_rank,
        dp_size=dp_size,
        num_workers=num_workers,
        max_tokens=max_tokens,
        checksums=verify in ("sample", "sha256"),
        **kwargs,
    )
    log.info("loader over %d samples ready in %.2fs", len(index), time.perf_counter() - t0)
    return loader


def _needs_full_check(index: DatasetIndex) -> bool:
    """``verify="sample"``: whether every shard's sha256 must be checked at start (an edited shard
    table; an index without per-sample checksums up to :data:`FULL_CHECK_BYTES`), said once."""
    if index.integrity == "shards_edited":
        return True  # read_index has said why
    if index.checksummed:
        return False
    total = int(index.shards["bytes"].sum())
    if index.sidecars is not None:
        total += int(index.sidecars["bytes"].sum())
    full = total <= FULL_CHECK_BYTES
    if index.root not in _told:
        _told.add(index.root)
        log.warning(
            "%s: the index has no per-sample checksums (written by an older vfm): %s; write the "
            "shards again (vfm shard / vfm index) to check every sample as it is read",
            index.root,
            f"checking every shard's sha256 now ({total / 1e6:.0f} MB)"
            if full
            else f"checking shard sizes only ({total / 1e9:.1f} GB is too much to hash at start)",
        )
    return full
