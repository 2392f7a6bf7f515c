"""The columnar, lazy dataset index: ``index.json`` (small) + ``samples.parquet`` (the rows).

A dataset of 10^8 samples cannot be an ``index.json`` that every rank parses into a DataFrame.
In the columnar form (``schema_version`` 2, ``format: "parquet"``) ``index.json`` keeps only what
is small and needed up front — the shard (and sidecar) table, ``meta``, ``n_samples`` and
summary ``stats`` — and the sample rows go to ``samples.parquet`` in row groups of
``row_group_size`` rows (16,384 by default), in shard order. A rank opens the parquet footer only
(local or ``s3://`` through fsspec) and reads a row group the first time one of its rows is asked
for; a small LRU cache keeps the last few. Two kinds of read:

* :meth:`ParquetSamples.row` — the whole row group (every column), checked with the rules of
  the index's pandera schema (vectorised with arrow / numpy: the schema itself costs ~100 ms per
  64k rows) and against the shard table, so bad data is named by URL, row group and sample;
* :meth:`ParquetSamples.geometry` / :meth:`ParquetSamples.geometries` — only the geometry
  columns (what the packed planner needs for every global position), checked with vectorised
  bounds; a separate, larger cache, and the loader asks for a whole step's samples at once (row
  groups read in batches on arrow's thread pool).

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
import threading
from collections import OrderedDict
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np
import pandas as pd
import pandera.pandas as pa
import pyarrow as pa_arrow
import pyarrow.compute as pc
import pyarrow.parquet as pq

from vfm_core import storage
from vfm_core.data.index import (
    FOREIGN_COLUMNS,
    DatasetIndex,
    DatasetIndexError,
    _short,
)

SAMPLES_NAME = "samples.parquet"
ROW_GROUP_SIZE = 1 << 14
"""Rows per row group: a random row costs one row-group read (~5-8 ms at 16k rows, ~30 ms at 64k,
with the checks), a row group ~0.8 kB of footer (6k row groups, ~5 MB, at 10^8 rows)."""
MAX_GEOMETRIES = 1 << 16
"""Distinct geometries kept in ``stats`` (more: None, and start-up checks scan the column)."""
GEOMETRY = ("frames", "height", "width", "latent_c", "latent_t", "latent_h", "latent_w")
_ROW_ORDER = (
    "key",
    "shard",
    "offset",
    "length",
    "frames",
    "height",
    "width",
    "latent_shape",
    *FOREIGN_COLUMNS,
    "checksum",
)
CHECKSUM_RULE = (r"^[0-9a-f]{32}$", "32 lower-case hex digits or null")
_STRING_RULES = {  # the string checks of the index's SampleTable, as arrow regexes
    "key": (r"^[A-Za-z0-9_-]+$", r"must match ^[A-Za-z0-9_-]+$"),
    "member_key": (r"^(?:[^/]+/)*[^/.]+$", "relative tar key, no '.' or '..'"),
    "media": (r"^[a-z0-9]+$", "must match ^[a-z0-9]+$"),
}
_INT_RULES = {
    "shard": 0,
    "offset": 0,
    "length": 1,
    "frames": 1,
    "height": 1,
    "width": 1,
    "latent_c": 0,
    "emb_shard": 0,
    "emb_offset": 0,
    "emb_length": 1,
}


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


# ---------------------------------------------------------------------------- reading
class ParquetSamples:
    """Lazy access to ``samples.parquet`` by row number (see the module docstring).

    ``reads`` counts row-group reads (``("rows", g)`` / ``("geometry", g)``) for tests and
    benchmarks. Thread-safe: the loader's reader threads ask for rows concurrently."""

    def __init__(
        self,
        url: str,
        *,
        shard_bytes: np.ndarray,
        sidecar_bytes: np.ndarray | None,
        n_samples: int,
        row_cache: int = 8,
        geometry_cache: int = 64,
    ) -> None:
        self.url = url
        self._lock = threading.RLock()
        fs, path = storage.filesystem(url)
        try:
            # remote: small read-ahead blocks (s3fs defaults to 50 MB), a row group's columns
            # lie next to each other so one block or two serve a row-group read
            # (local files: arrow's own reader, ~3x faster than through a Python file object)
            opts = {"block_size": 1 << 18, "cache_type": "readahead"}
            self._file = fs.open(path, "rb", **opts) if storage.is_remote(url) else None
            self._pf = pq.ParquetFile(self._file if self._file is not None else path)
        except FileNotFoundError:
            raise DatasetIndexError(f"{url}: the sample table is missing") from None
        except (OSError, pa_arrow.ArrowException) as e:
            raise DatasetIndexError(f"{url}: not a readable parquet file ({e})") from None
        md = self._pf.metadata
        sizes = np.array([md.row_group(g).num_rows for g in range(md.num_row_groups)], np.int64)
        self.starts = np.concatenate([[0], np.cumsum(sizes)])  # (G + 1,)
        if md.num_rows != n_samples:
            raise DatasetIndexError(
                f"{url}: {md.num_rows} rows, the index says n_samples={n_samples}"
            )
        names = set(self._pf.schema_arrow.names)
        self.foreign = "member_key" in names
        missing = set(arrow_schema(self.foreign, checksum=False).names) - names
        if missing:
            raise DatasetIndexError(f"{url}: sample table lacks the columns {sorted(missing)}")
        self.shard_bytes, self.sidecar_bytes = shard_bytes, sidecar_bytes
        self._rows: OrderedDict[int, pd.DataFrame] = OrderedDict()
        self._geom: OrderedDict[int, np.ndarray] = OrderedDict()
        self.row_cache, self.geometry_cache = row_cache, geometry_cache
        self.reads: list[tuple[str, int]] = []
        self.latents = True
        """False when the stats say no sample has a stored latent (geometry reads skip those
        columns)."""

    def __len__(self) -> int:
        return int(self.starts[-1])

    @property
    def n_row_groups(self) -> int:
        return len(self.starts) - 1

    def locate(self, i: int) -> tuple[int, int]:
        """(row group, row inside it) of sample ``i``."""
        if not 0 <= i < len(self):
            raise IndexError(f"sample {i} outside [0, {len(self)})")
        g = int(np.searchsorted(self.starts, i, side="right")) - 1
        return g, i - int(self.starts[g])

    def _read(self, g: int, columns: list[str] | None) -> pa_arrow.Table:
        try:
            t = self._pf.read_row_group(g, columns=columns)
        except (OSError, pa_arrow.ArrowException) as e:
            raise DatasetIndexError(f"{self.url}: row group {g} cannot be read ({e})") from None
        if len(t) != self.starts[g + 1] - self.starts[g]:
            raise DatasetIndexError(
                f"{self.url}: row group {g} has {len(t)} rows, footer says "
                f"{self.starts[g + 1] - self.starts[g]}"
            )
        return t

    def group(self, g: int) -> dict[str, Any]:
        """Row group ``g``, checked, as columns (numpy for ints, arrow for strings; cached)."""
        with self._lock:
            hit = self._rows.get(g)
            if hit is not None:
                self._rows.move_to_end(g)
                return hit
            self.reads.append(("rows", g))
            t = self._read(g, None)
            cols: dict[str, Any] = {}
            for name in t.column_names:
                col = t[name].combine_chunks()
                if pa_arrow.types.is_integer(col.type):
                    col = col.to_numpy(zero_copy_only=False).astype(np.int64)
                cols[name] = col
            self._validate(g, cols)
            self._rows[g] = cols
            while len(self._rows) > self.row_cache:
                self._rows.popitem(last=False)
            return cols

    def _validate(self, g: int, cols: dict[str, Any]) -> None:
        """The checks of the index's pandera ``SampleTable``, vectorised over the row group (the
        schema itself costs ~100 ms per 65k rows), plus the byte ranges against the shard table."""
        where = f"{self.url}: row group {g} fails the index schema"

        def fail(column: str, rule: str, ok: Any) -> None:
            bad = np.flatnonzero(~np.asarray(ok, dtype=bool))
            if len(bad):
                row = int(self.starts[g]) + int(bad[0])
                raise DatasetIndexError(
                    f"{where}: column {column!r} {rule} ({len(bad)} rows, first: sample {row})"
                )

        for c, (regex, rule) in _STRING_RULES.items():
            if c in cols:
                col = cols[c]
                fail(c, "must not be null", pc.is_valid(col).to_numpy(zero_copy_only=False))
                ok = pc.match_substring_regex(col, regex).to_numpy(zero_copy_only=False)
                fail(c, rule, ok)
        if "member_key" in cols:
            dots = pc.match_substring_regex(cols["member_key"], r"(^|/)\.\.(/|$)")
            fail(
                "member_key",
                "relative tar key, no '.' or '..'",
                ~dots.to_numpy(zero_copy_only=False),
            )
        if "checksum" in cols:  # null: a sample without one
            ok = pc.fill_null(pc.match_substring_regex(cols["checksum"], CHECKSUM_RULE[0]), True)
            fail("checksum", CHECKSUM_RULE[1], ok.to_numpy(zero_copy_only=False))
        if pc.count_distinct(cols["key"]).as_py() != len(cols["key"]):
            raise DatasetIndexError(f"{where}: column 'key' holds duplicate keys")
        for c, low in _INT_RULES.items():
            if c in cols:
                fail(c, f"must be >= {low}", cols[c] >= low)
        lat = np.stack([cols[c] for c in GEOMETRY[3:]], 1)
        fail(
            "latent_shape",
            "[C, T, H, W] positive ints (or 0 = none)",
            (lat > 0).all(1) | (lat == 0).all(1),
        )
        for keys, sizes, what in (
            (("shard", "offset", "length"), self.shard_bytes, "shard"),
            (("emb_shard", "emb_offset", "emb_length"), self.sidecar_bytes, "sidecar"),
        ):
            if sizes is None or keys[0] not in cols:
                continue
            s = cols[keys[0]]
            if (s >= len(sizes)).any():
                raise DatasetIndexError(f"{where}: a sample names a {what} the index lacks")
            if (cols[keys[1]] + cols[keys[2]] > sizes[s]).any():
                raise DatasetIndexError(f"{where}: a sample's byte range runs past its {what}")

    @property
    def _geometry_names(self) -> list[str]:
        return list(GEOMETRY if self.latents else GEOMETRY[:3])  # no latents: 3 columns

    def _checked_geometry(self, g: int, t: pa_arrow.Table) -> np.ndarray:
        """(rows, 7) int32 geometry of row group ``g`` from its geometry columns ``t``."""
        cols = [t[c].to_numpy() for c in self._geometry_names]
        cols += [np.zeros(len(t), np.int32)] * (len(GEOMETRY) - len(cols))
        geom = np.column_stack(cols).astype(np.int32)  # (rows, 7)
        bad = min(int(c.min()) for c in cols[:3]) <= 0 if len(geom) else False
        if not bad and int(cols[3].max(initial=0)) > 0:  # any stored latent shape
            lat = geom[:, 3:]
            bad = not ((lat > 0).all(1) | (lat == 0).all(1)).all()
        if bad:
            raise DatasetIndexError(
                f"{self.url}: row group {g}: frames/height/width must be positive and a "
                "latent shape all positive or all 0"
            )
        return geom

    def _cache_geometry(self, g: int, geom: np.ndarray) -> None:
        self._geom[g] = geom
        while len(self._geom) > self.geometry_cache:
            self._geom.popitem(last=False)

    def geometry_group(self, g: int) -> np.ndarray:
        """(rows, 7) int32 :data:`GEOMETRY` columns of row group ``g`` (cached)."""
        with self._lock:
            hit = self._geom.get(g)
            if hit is not None:
                self._geom.move_to_end(g)
                return hit
            full = self._rows.get(g)
            if full is None:
                self.reads.append(("geometry", g))
                geom = self._checked_geometry(g, self._read(g, self._geometry_names))
            else:
                geom = np.stack([full[c] for c in GEOMETRY], 1).astype(np.int32)
            self._cache_geometry(g, geom)
            return geom

    def geometries(self, ids: np.ndarray, *, batch: int = 32) -> np.ndarray:
        """(len(ids), 7) geometry of many samples (the packer's next step): missing row groups
        are read ``batch`` at a time in one call each (arrow decodes them on its thread pool),
        and only the asked-for rows are kept, so memory stays bounded."""
        ids = np.asarray(ids, np.int64)
        g_of = np.searchsorted(self.starts, ids, side="right") - 1
        out = np.empty((len(ids), 7), np.int32)
        missing = []
        with self._lock:
            for g in np.unique(g_of).tolist():
                hit = self._geom.get(g)
                if hit is None:
                    missing.append(g)
                else:
                    mask = g_of == g
                    out[mask] = hit[ids[mask] - self.starts[g]]
            for k in range(0, len(missing), batch):
                some = missing[k : k + batch]
                try:
                    t = self._pf.read_row_groups(
                        some, columns=self._geometry_names, use_threads=True
                    )
                except (OSError, pa_arrow.ArrowException):
                    t = None  # one at a time below, so the error names its row group
                off = 0
                for g in some:
                    n = int(self.starts[g + 1] - self.starts[g])
                    self.reads.append(("geometry", g))
                    part = t.slice(off, n) if t is not None else self._read(g, self._geometry_names)
                    geom = self._checked_geometry(g, part)
                    mask = g_of == g
                    out[mask] = geom[ids[mask] - self.starts[g]]
                    off += n
        return out

    def row(self, i: int) -> dict[str, Any]:
        """Sample ``i`` in the JSON form (``latent_shape``: [C, T, H, W] or None)."""
        g, j = self.locate(i)
        cols = self.group(g)
        out: dict[str, Any] = {}
        for c in _ROW_ORDER:
            if c == "latent_shape":
                lat = [int(cols[k][j]) for k in GEOMETRY[3:]]
                out[c] = lat if lat[0] > 0 else None
            elif c in cols:
                v = cols[c][j]
                out[c] = v.as_py() if isinstance(v, pa_arrow.Scalar) else int(v)
        return out

    def geometry(self, i: int) -> np.ndarray:
        """(7,) frames, height, width, latent C, T, H, W (0 without a latent) of sample ``i``."""
        g, j = self.locate(i)
        return self.geometry_group(g)[j]

    def frame(self) -> pd.DataFrame:
        """The whole table in the JSON form (O(N) memory: tools and migration, not the loader)."""
        for g in range(self.n_row_groups):
            self.group(g)  # checked, a row group at a time
        try:
            return arrow_to_frame(self._pf.read())
        except (OSError, pa_arrow.ArrowException) as e:
            raise DatasetIndexError(f"{self.url}: cannot be read ({e})") from None

    def close(self) -> None:
        if self._file is not None:
            self._file.close()


class ParquetIndex(DatasetIndex):
    """A :class:`DatasetIndex` whose sample rows stay in ``samples.parquet`` until asked for.

    ``samples`` still works (it reads the whole table: for tools such as ``vfm encode-shards``);
    the loader uses :meth:`row` / :meth:`geometry` / :attr:`stats`, which never do."""

    __slots__ = ("table", "_stats", "_frame")

    def __init__(self, *, table: ParquetSamples, stats: dict[str, Any], **fields: Any) -> None:
        self.table, self._stats, self._frame = table, stats, None
        table.latents = stats.get("latent_channels") != []
        super().__init__(samples=None, **fields)

    @property  # type: ignore[override]
    def samples(self) -> pd.DataFrame:
        if self._frame is None:
            self._frame = self.table.frame()
        return self._frame

    @samples.setter
    def samples(self, value: pd.DataFrame | None) -> None:
        self._frame = value

    def __repr__(self) -> str:
        return f"ParquetIndex(root={self.root!r}, n_samples={len(self)})"

    def __len__(self) -> int:
        return len(self.table)

    @property
    def foreign(self) -> bool:
        return self.table.foreign

    @property
    def stats(self) -> dict[str, Any] | None:
        return self._stats

    @property
    def checksummed(self) -> bool:
        """From the stats (written with the file): no row is read."""
        return int(self._stats.get("checksummed") or 0) == len(self) > 0

    def row(self, i: int) -> dict[str, Any]:
        return self.table.row(i)

    def geometry(self, i: int) -> np.ndarray:
        return self.table.geometry(i)

    def geometries(self, ids: np.ndarray) -> np.ndarray:
        return self.table.geometries(ids)

    def iter_geometries(self) -> Iterator[np.ndarray]:
        for g in range(self.table.n_row_groups):
            yield self.table.geometry_group(g)


def open_parquet_index(url: str, doc: dict[str, Any], root: str) -> ParquetIndex:
    """The columnar index whose ``index.json`` (at ``url``) parsed to ``doc``."""
    from vfm_core.data.index import ShardTable, SidecarTable

    try:
        shards = pd.DataFrame(doc["shards"], columns=list(ShardTable.columns))
        sidecars = None
        if doc.get("sidecars") is not None:
            sidecars = pd.DataFrame(doc["sidecars"], columns=list(SidecarTable.columns))
        n, dim = int(doc["n_samples"]), int(doc["embedding_dim"])
        name = str(doc.get("samples_file", SAMPLES_NAME))
        stats = dict(doc.get("stats") or {})
    except (KeyError, TypeError, ValueError) as e:
        raise DatasetIndexError(f"{url}: missing or malformed field ({e})") from None
    try:
        ShardTable.validate(shards, lazy=True)
        if sidecars is not None:
            SidecarTable.validate(sidecars, lazy=True)
    except (pa.errors.SchemaErrors, pa.errors.SchemaError) as e:
        raise DatasetIndexError(f"{url}: index fails its schema:\n{_short(e)}") from None
    for table, what in ((shards, "shard"), (sidecars, "sidecar")):
        if table is not None and int(table["n_samples"].sum()) != n:
            raise DatasetIndexError(
                f"{url}: per-{what} sample counts do not add up to n_samples={n}"
            )
    samples = ParquetSamples(
        storage.join(root, name),
        shard_bytes=shards["bytes"].to_numpy(np.int64),
        sidecar_bytes=None if sidecars is None else sidecars["bytes"].to_numpy(np.int64),
        n_samples=n,
    )
    if samples.foreign != (sidecars is not None):
        raise DatasetIndexError(
            f"{url}: a foreign dataset needs the sample columns "
            f"{list(FOREIGN_COLUMNS)} and a sidecars table"
        )
    return ParquetIndex(
        table=samples,
        stats=stats,
        root=str(root),
        shards=shards,
        embedding_dim=dim,
        meta=doc.get("meta", {}),
        sidecars=sidecars,
    )
