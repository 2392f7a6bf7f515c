"""The token-grid, bucket and size queries of a dataset index for
:class:`~vfm_core.data.loader.ShardLoader` (:class:`SampleGeometry`, which the loader holds):
every sample's token grid from the index's geometry (JSON index: all precomputed; columnar index:
per sample, cached, and a step's worth read ahead in one call), its bucket, and the dataset's
extremes from the index's summary stats when it has them."""

from __future__ import annotations

import numpy as np

from vfm_core.data.buckets import Bucket, BucketSpec, assign_bucket
from vfm_core.data.index_tables import DatasetIndex
from vfm_core.geometry import Grid


class SampleGeometry:
    """Token grids of the samples of ``index`` for a model with patch size ``patch`` over latents
    of a tokenizer with ``compression``; with ``buckets``, every sample's bucket."""

    def __init__(
        self,
        index: DatasetIndex,
        *,
        patch: Grid,
        compression: Grid,
        buckets: BucketSpec | None = None,
    ) -> None:
        self.index, self.patch, self.compression = index, patch, compression
        self.buckets = buckets
        self.bucket_list: list[Bucket] = [] if buckets is None else buckets.buckets()
        """The shapes of ``buckets`` (what :meth:`bucket_of` indexes)."""
        # JSON index: every grid precomputed (vectorised); columnar index: computed per sample
        # from its row group's geometry, and start-up checks read the index's summary stats
        self._grids: list[Grid] | None = self._all_grids() if index.stats is None else None
        self._grid_cache: dict[int, Grid] = {}
        self._bucket_of: list[int | None] | None = None
        if buckets is not None and (index.stats or {}).get("geometries") is None:
            rows = index.samples  # no stats to answer from: every sample's bucket, up front
            self._bucket_of = [
                assign_bucket(int(f), int(h), int(w), buckets)
                for f, h, w in zip(rows["frames"], rows["height"], rows["width"])
            ]

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

    def bucket_shape(self, i: int) -> Bucket | None:
        """(height, width, frames) of sample ``i``'s bucket; None without buckets."""
        return None if self.buckets is None else self.bucket_list[self.bucket_of(i)]

    def any_bucket_fits(self) -> bool:
        """Whether some sample has a bucket (``buckets`` only): from the index's stats when it has
        them, else from every sample's bucket."""
        assert self.buckets is not None
        if self._bucket_of is not None:
            return any(b is not None for b in self._bucket_of)
        geoms = (self.index.stats or {}).get("geometries")
        return any(assign_bucket(g[0], g[1], g[2], self.buckets) is not None for g in geoms)

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

    @property
    def read_ahead(self) -> bool:
        """Whether :meth:`prefetch` helps: grids computed per sample from an index that reads
        the geometries of many samples in one call (columnar)."""
        return self._grids is None and hasattr(self.index, "geometries")

    def prefetch(self, ids: np.ndarray) -> None:
        """Columnar index: the grids of samples ``ids`` (those the packer will likely ask for),
        their row groups read in one call rather than one read per sample as the packer asks."""
        fresh = np.array([i for i in ids.tolist() if i not in self._grid_cache], np.int64)
        if len(fresh):
            grids = self._grids_of(self.index.geometries(fresh))  # (n, 3)
            if len(self._grid_cache) + len(fresh) >= 1 << 16:
                self._grid_cache.clear()
            for i, g in zip(fresh.tolist(), grids.tolist()):
                self._grid_cache[i] = (g[0], g[1], g[2])
