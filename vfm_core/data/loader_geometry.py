"""The token-grid, bucket and size queries of :class:`~vfm_core.data.loader.ShardLoader`
(:class:`LoaderGeometry`, a mixin): every sample's token grid from the index's geometry (JSON
index: all precomputed; columnar index: per sample, cached, and a step's worth read ahead in one
call), its bucket, and the dataset's extremes from the index's summary stats when it has them."""

from __future__ import annotations

import numpy as np

from vfm_core.data.blend import BucketPlanner, BucketSpec, assign_bucket
from vfm_core.data.index import DatasetIndex
from vfm_core.data.plan import GlobalOrder, Planner
from vfm_core.geometry import Grid


class LoaderGeometry:
    """Mixed into :class:`~vfm_core.data.loader.ShardLoader`, which sets the attributes below."""

    index: DatasetIndex
    patch: Grid
    compression: Grid
    buckets: BucketSpec | None
    order: GlobalOrder
    planner: Planner | BucketPlanner
    max_tokens: int | None
    dp_size: int
    batch_size: int
    buffer_size: int
    _grids: list[Grid] | None
    _grid_cache: dict[int, Grid]
    _bucket_of: list[int | None] | None
    _walked: int

    # ------------------------------------------------------------------ geometry
    def _all_grids(self) -> list[Grid]:
        """Token grid (t, h, w) of every sample of an in-memory (JSON) index, vectorised."""
        grids = np.concatenate([self._grids_of(g) for g in self.index.iter_geometries()])
        return [(int(a), int(b), int(c)) for a, b, c in grids]

    def _grids_of(self, geom: np.ndarray) -> np.ndarray:
        """Token grids (n, 3) of geometry rows (n, 7) (frames, height, width, latent C, T, H, W;
        C = 0 without a stored latent): the same formula as :meth:`_all_grids`."""
        geom = np.asarray(geom, np.int64).reshape(-1, 7)
        ct, ch, cw = self.compression
        thw = np.stack([1 + (geom[:, 0] - 1) // ct, geom[:, 1] // ch, geom[:, 2] // cw], 1)
        lat = geom[:, 3] > 0
        thw[lat] = geom[lat, 4:7]
        return np.maximum(1, thw // np.array(self.patch, np.int64))  # (n, 3)

    def grid(self, i: int) -> Grid:
        """Token grid (t, h, w) of sample ``i``."""
        if self._grids is not None:
            return self._grids[i]
        hit = self._grid_cache.get(i)  # the packer asks again for every sample in its buffer
        if hit is not None:
            return hit
        a, b, c = self._grids_of(self.index.geometry(i))[0].tolist()
        g = (a, b, c)
        if len(self._grid_cache) >= 1 << 16:
            self._grid_cache.clear()
        self._grid_cache[i] = g
        return g

    def tokens(self, i: int) -> int:
        g = self.grid(i)
        return g[0] * g[1] * g[2]

    def bucket_of(self, i: int) -> int | None:
        """Bucket of sample ``i`` (``buckets`` only)."""
        assert self.buckets is not None
        if self._bucket_of is not None:
            return self._bucket_of[i]
        f, h, w = (int(x) for x in self.index.geometry(i)[:3])
        return assign_bucket(f, h, w, self.buckets)

    def token_extremes(self) -> tuple[int, int, int]:
        """(fewest tokens of any sample, most tokens, the first sample with the most): from the
        index's summary stats when it has them, else a scan of every sample."""
        geoms = (self.index.stats or {}).get("geometries")
        if geoms is not None:
            a = np.array(geoms, np.int64).reshape(-1, 9)  # geometry, count, first row
            tok = self._grids_of(a[:, :7]).prod(1)
            top = tok == tok.max()
            return int(tok.min()), int(tok.max()), int(a[top, 8].min())
        if self._grids is not None:
            tok = np.array([g[0] * g[1] * g[2] for g in self._grids], np.int64)
        else:
            tok = np.concatenate([self._grids_of(c).prod(1) for c in self.index.iter_geometries()])
        return int(tok.min()), int(tok.max()), int(tok.argmax())

    def largest_sample(self) -> tuple[int, int, int]:
        """(frames, height, width) of the sample with the most pixels over time (from the index's
        stats when it has them, else a scan)."""
        geoms = (self.index.stats or {}).get("geometries")
        if geoms is not None:
            rows = np.array(geoms, np.int64).reshape(-1, 9)[:, :3]
        else:
            rows = np.concatenate([g[:, :3] for g in self.index.iter_geometries()])
        f, h, w = rows[int(np.argmax(rows.prod(1)))].tolist()
        return int(f), int(h), int(w)

    def _prefetch_grids(self) -> None:
        """Columnar index, packed: the grids of the positions the packer will likely walk this
        step (as many as last step, plus a margin), their row groups read in one call rather
        than one read per sample as the packer asks."""
        if self._grids is not None or not isinstance(self.planner, Planner):
            return
        if self.max_tokens is None or not hasattr(self.index, "geometries"):
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
        fresh = np.array([i for i in ids.tolist() if i not in self._grid_cache], np.int64)
        if len(fresh):
            grids = self._grids_of(self.index.geometries(fresh))  # (n, 3)
            if len(self._grid_cache) + len(fresh) >= 1 << 16:
                self._grid_cache.clear()
            for i, g in zip(fresh.tolist(), grids.tolist()):
                self._grid_cache[i] = (g[0], g[1], g[2])
