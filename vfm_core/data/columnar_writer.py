"""The columns of ``samples.parquet`` (the columnar index's sample rows), their conversion to and
from the JSON-form sample DataFrame, the summary stats and the streaming writer; the lazy reader
is :mod:`vfm_core.data.columnar_reader`, the index over both :mod:`vfm_core.data.columnar`.

``stats["geometries"]`` lists the dataset's distinct geometries ``[frames, height, width, C, T,
H, W, count, first_row]`` (C..W = 0 without a stored latent), at most :data:`MAX_GEOMETRIES` of
them (else None): every start-up check that used to scan all samples (largest / smallest token
grid, latent channels, buckets) reads that list instead. The latent shape is stored as four int
columns ``latent_c`` .. ``latent_w`` (0 = none) and handed out as ``[C, T, H, W]`` or None, as in
the JSON index. The per-sample ``checksum`` is the last column (null for a sample without one;
files of older vfm versions lack the column) and ``stats["checksummed"]`` counts the samples that
have one.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterable
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa_arrow
import pyarrow.parquet as pq

from vfm_core import storage
from vfm_core.data.index_tables import FOREIGN_COLUMNS

SAMPLES_NAME = "samples.parquet"
ROW_GROUP_SIZE = 1 << 14
"""Rows per row group: a random row costs one row-group read (~5-8 ms at 16k rows, ~30 ms at 64k,
with the checks), a row group ~0.8 kB of footer (6k row groups, ~5 MB, at 10^8 rows)."""
MAX_GEOMETRIES = 1 << 16
"""Distinct geometries kept in ``stats`` (more: None, and start-up checks scan the column)."""
GEOMETRY = ("frames", "height", "width", "latent_c", "latent_t", "latent_h", "latent_w")


def arrow_schema(foreign: bool, *, checksum: bool = True) -> pa_arrow.Schema:
    """The parquet columns; ``checksum=False``: without the (optional, last) checksum column."""
    fields = [("key", pa_arrow.string())]
    fields += [(c, pa_arrow.int64()) for c in ("shard", "offset", "length")]
    fields += [(c, pa_arrow.int32()) for c in GEOMETRY]
    if foreign:
        fields += [("member_key", pa_arrow.string()), ("media", pa_arrow.string())]
        fields += [(c, pa_arrow.int64()) for c in ("emb_shard", "emb_offset", "emb_length")]
    if checksum:
        fields.append(("checksum", pa_arrow.string()))
    return pa_arrow.schema(fields)


def with_checksum(t: pa_arrow.Table) -> pa_arrow.Table:
    """``t`` with a null ``checksum`` column appended when it has none (rows of an older vfm)."""
    if "checksum" in t.column_names:
        return t
    return t.append_column("checksum", pa_arrow.nulls(len(t), pa_arrow.string()))


# ---------------------------------------------------------------------------- conversion
def frame_to_arrow(samples: pd.DataFrame, foreign: bool) -> pa_arrow.Table:
    """A JSON-form sample DataFrame -> the parquet columns (latent_shape -> four int columns)."""
    lat = np.zeros((len(samples), 4), np.int32)
    for j, s in enumerate(samples["latent_shape"]):
        if isinstance(s, list | tuple | np.ndarray):
            lat[j] = s
    cols: dict[str, Any] = {c: samples[c].to_numpy() for c in ("key", "shard", "offset", "length")}
    for c in ("frames", "height", "width"):
        cols[c] = samples[c].to_numpy(np.int32)
    for k, c in enumerate(("latent_c", "latent_t", "latent_h", "latent_w")):
        cols[c] = lat[:, k]
    if foreign:
        cols.update({c: samples[c].to_numpy() for c in FOREIGN_COLUMNS})
    if "checksum" in samples.columns:
        cols["checksum"] = [c if isinstance(c, str) else None for c in samples["checksum"]]
    else:
        cols["checksum"] = [None] * len(samples)
    return pa_arrow.Table.from_pydict(cols, schema=arrow_schema(foreign))


def arrow_to_frame(table: pa_arrow.Table) -> pd.DataFrame:
    """Parquet columns -> the JSON-form sample DataFrame (what pandera validates)."""
    df = table.to_pandas()
    lat = df[["latent_c", "latent_t", "latent_h", "latent_w"]].to_numpy(np.int64)
    shapes = [None if r[0] == 0 else [int(x) for x in r] for r in lat]
    out = df[["key", "shard", "offset", "length", "frames", "height", "width"]].copy()
    for c in ("frames", "height", "width"):
        out[c] = out[c].astype(np.int64)
    out["latent_shape"] = pd.Series(shapes, index=out.index, dtype=object)
    if "member_key" in df.columns:
        for c in FOREIGN_COLUMNS:
            out[c] = df[c]
    if "checksum" in df.columns and df["checksum"].notna().any():
        out["checksum"] = df["checksum"]
    return out


# ---------------------------------------------------------------------------- stats
def _unique_rows(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(distinct rows (k, d), first index of each, inverse (n,)) of a non-negative int matrix;
    rows packed into one int64 (mixed radix) when they fit, then hashed (~50x faster)."""
    mx = rows.max(0) + 1 if len(rows) else np.ones(rows.shape[1], np.int64)
    if float(np.prod(mx.astype(np.float64))) < 2.0**62:
        weights = np.cumprod(np.concatenate([[1], mx[::-1][:-1]]))[::-1].astype(np.int64)
        inv, uniq = pd.factorize((rows * weights).sum(1))  # hashing: O(n)
        first = np.full(len(uniq), len(rows), np.int64)
        np.minimum.at(first, inv, np.arange(len(rows)))
        return rows[first], first, inv.astype(np.int64)
    u, first, inv = np.unique(rows, axis=0, return_index=True, return_inverse=True)
    return u, first, inv.ravel()


class StatsBuilder:
    """Summary stats over chunks of parquet columns (distinct geometries, latent channels)."""

    def __init__(self) -> None:
        self.n = 0
        self.parts: list[np.ndarray] = []  # (k, 9): geometry + count + first row
        self.too_many = False

    def add(self, geom: np.ndarray) -> None:
        """``geom``: (n, 7) int64 rows of :data:`GEOMETRY` for the next ``n`` samples."""
        if not self.too_many and len(geom):
            u, first, inv = _unique_rows(geom)
            counts = np.bincount(inv, minlength=len(u))
            self.parts.append(np.column_stack([u, counts, first + self.n]))
            if sum(len(p) for p in self.parts) > 4 * MAX_GEOMETRIES:
                self._merge()
        self.n += len(geom)

    def _merge(self) -> None:
        allp = np.concatenate(self.parts)
        u, _, inv = _unique_rows(allp[:, :7])
        counts = np.bincount(inv, weights=allp[:, 7], minlength=len(u)).astype(np.int64)
        first = np.full(len(u), np.iinfo(np.int64).max)
        np.minimum.at(first, inv, allp[:, 8])
        self.parts = [np.column_stack([u, counts, first])]
        if len(u) > MAX_GEOMETRIES:
            self.too_many, self.parts = True, []

    def stats(self) -> dict[str, Any]:
        geoms = None
        if not self.too_many:
            if self.parts:
                self._merge()
            if not self.too_many:
                geoms = [[int(x) for x in r] for r in self.parts[0]] if self.parts else []
        channels = None if geoms is None else sorted({g[3] for g in geoms if g[3] > 0})
        return {"n_samples": self.n, "geometries": geoms, "latent_channels": channels}


# ---------------------------------------------------------------------------- writing
def write_samples(
    url: str,
    chunks: Iterable[pa_arrow.Table],
    *,
    foreign: bool,
    row_group_size: int = ROW_GROUP_SIZE,
) -> dict[str, Any]:
    """Write ``samples.parquet`` from tables of :func:`arrow_schema` (streamed, so N rows never
    sit in memory at once); returns the summary stats. Atomic (local temp file, then moved /
    uploaded)."""
    builder = StatsBuilder()
    fd, tmp = tempfile.mkstemp(prefix="vfm-samples-", suffix=".parquet")
    os.close(fd)
    schema = arrow_schema(foreign)
    pending: list[pa_arrow.Table] = []
    n_pending = checksummed = 0
    try:
        with pq.ParquetWriter(tmp, schema, compression="snappy", write_statistics=False) as w:

            def flush(final: bool) -> int:
                nonlocal pending
                t = pa_arrow.concat_tables(pending) if pending else schema.empty_table()
                cut = len(t) if final else len(t) // row_group_size * row_group_size
                if cut:
                    w.write_table(t.slice(0, cut), row_group_size=row_group_size)
                pending = [t.slice(cut)] if cut < len(t) else []
                return len(t) - cut

            for t in chunks:
                t = with_checksum(t).cast(schema)
                checksummed += len(t) - t["checksum"].null_count
                geom = np.column_stack([t[c].to_numpy().astype(np.int64) for c in GEOMETRY])
                builder.add(geom)
                pending.append(t)
                n_pending += len(t)
                if n_pending >= row_group_size:
                    n_pending = flush(False)
            flush(True)
        storage.put_file(tmp, url)
    finally:
        os.unlink(tmp)
    return {**builder.stats(), "checksummed": checksummed, "row_group_size": row_group_size}
