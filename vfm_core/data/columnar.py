"""The columnar, lazy dataset index: ``index.json`` (small) + ``samples.parquet`` (the rows).

A dataset of 10^8 samples cannot be an ``index.json`` that every rank parses into a DataFrame.
In the columnar form (``schema_version`` 2, ``format: "parquet"``) ``index.json`` keeps only what
is small and needed up front — the shard (and sidecar) table, ``meta``, ``n_samples`` and
summary ``stats`` — and the sample rows go to ``samples.parquet`` in row groups of
``row_group_size`` rows (16,384 by default), in shard order. A rank opens the parquet footer only
(local or ``s3://`` through fsspec) and reads a row group the first time one of its rows is asked
for; a small LRU cache keeps the last few.

The pieces: :mod:`vfm_core.data.columnar_writer` (the columns, conversion to and from the JSON
form, the summary stats, the writer), :mod:`vfm_core.data.columnar_reader` (the lazy, checked
row-group reads) and, here, the :class:`ParquetIndex` over them and :func:`open_parquet_index`.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pandas as pd

from vfm_core import storage
from vfm_core.data.columnar_reader import ParquetSamples
from vfm_core.data.columnar_writer import SAMPLES_NAME
from vfm_core.data.index_tables import (
    FOREIGN_COLUMNS,
    DatasetIndex,
    DatasetIndexError,
    ShardTable,
    SidecarTable,
    validate_schema,
)


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
    if n == 0:
        raise DatasetIndexError(f"{url}: no samples (n_samples is 0)")
    validate_schema(ShardTable, shards, where=url, table="shards")
    if sidecars is not None:
        validate_schema(SidecarTable, sidecars, where=url, table="sidecars")
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
