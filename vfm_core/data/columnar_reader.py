"""Lazy access to ``samples.parquet`` by row number: :class:`ParquetSamples` (the columns and the
writer are in :mod:`vfm_core.data.columnar_writer`). Two kinds of read:

* :meth:`ParquetSamples.row` — the whole row group (every column), checked with the rules of
  the index's pandera schema (vectorised with arrow / numpy: the schema itself costs ~100 ms per
  64k rows) and against the shard table, so bad data is named by URL, row group and sample;
* :meth:`ParquetSamples.geometry` / :meth:`ParquetSamples.geometries` — only the geometry
  columns (what the packed planner needs for every global position), checked with vectorised
  bounds; a separate, larger cache, and the loader asks for a whole step's samples at once (row
  groups read in batches on arrow's thread pool).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa_arrow
import pyarrow.compute as pc
import pyarrow.parquet as pq

from vfm_core import storage
from vfm_core.data.columnar_writer import GEOMETRY, arrow_schema, arrow_to_frame
from vfm_core.data.index_tables import FOREIGN_COLUMNS, DatasetIndexError

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
