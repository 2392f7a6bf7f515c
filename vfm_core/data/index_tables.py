"""The dataset index in memory: :class:`DatasetIndex`, the pandera schemas of its shard, sidecar
and sample tables with their cross-checks (:func:`validate_tables`), and the seal of its own
checksums. The format, and reading and writing it in either form (JSON, columnar), are
:mod:`vfm_core.data.index`; the columnar form's lazy rows are :mod:`vfm_core.data.columnar`.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
import pandera.pandas as pa

from vfm_core import storage
from vfm_core.errors import UserError

SCHEMA_VERSION = 1
"""``schema_version`` of the JSON form (every sample row inside ``index.json``)."""
INTEGRITY_KEY = "integrity"
"""Top-level key of ``index.json`` holding its own checksums (:mod:`vfm_core.data.index`)."""


class DatasetIndexError(UserError, ValueError):
    """An index that is missing, malformed, of another schema version or disagrees with its
    shards; the message names the index URL and the problem."""


def _is_latent_shape(v: object) -> bool:
    return isinstance(v, list) and len(v) == 4 and all(type(x) is int and x > 0 for x in v)


def _shard_table(name_re: str) -> pa.DataFrameSchema:
    return pa.DataFrameSchema(
        {
            "name": pa.Column(str, pa.Check.str_matches(name_re), unique=True),
            "n_samples": pa.Column(int, pa.Check.gt(0)),
            "bytes": pa.Column(int, pa.Check.gt(0)),
            "sha256": pa.Column(str, pa.Check.str_matches(r"^[0-9a-f]{64}$")),
        },
        strict=True,
        coerce=False,
    )


ShardTable = _shard_table(r"^[A-Za-z0-9_.-]+\.tar$")
SidecarTable = _shard_table(r"^(?:[A-Za-z0-9_-][A-Za-z0-9_.-]*/)?[A-Za-z0-9_.-]+\.tar$")
"""Sidecar tars of a foreign dataset (relative to the root, e.g. ``_vfm/emb-000000.tar``)."""


def is_member_key(v: object) -> bool:
    return (
        isinstance(v, str)
        and bool(v)
        and not v.startswith("/")
        and "." not in v.rsplit("/", 1)[-1]
        and ".." not in v.split("/")
        and "" not in v.split("/")
    )


FOREIGN_COLUMNS = ("member_key", "media", "emb_shard", "emb_offset", "emb_length")
"""Optional sample columns of a foreign dataset (all or none; :mod:`vfm_core.data.index`)."""

SampleTable = pa.DataFrameSchema(
    {
        "key": pa.Column(str, pa.Check.str_matches(r"^[A-Za-z0-9_-]+$"), unique=True),
        "shard": pa.Column(int, pa.Check.ge(0)),
        "offset": pa.Column(int, pa.Check.ge(0)),
        "length": pa.Column(int, pa.Check.gt(0)),
        "frames": pa.Column(int, pa.Check.gt(0)),
        "height": pa.Column(int, pa.Check.gt(0)),
        "width": pa.Column(int, pa.Check.gt(0)),
        "latent_shape": pa.Column(
            object,
            pa.Check(_is_latent_shape, element_wise=True, error="[C, T, H, W] positive ints"),
            nullable=True,
        ),
        "member_key": pa.Column(
            str,
            pa.Check(is_member_key, element_wise=True, error="relative tar key, no '.' or '..'"),
            required=False,
        ),
        "media": pa.Column(str, pa.Check.str_matches(r"^[a-z0-9]+$"), required=False),
        "emb_shard": pa.Column(int, pa.Check.ge(0), required=False),
        "emb_offset": pa.Column(int, pa.Check.ge(0), required=False),
        "emb_length": pa.Column(int, pa.Check.gt(0), required=False),
        "checksum": pa.Column(
            str, pa.Check.str_matches(r"^[0-9a-f]{32}$"), nullable=True, required=False
        ),
    },
    strict=True,
    coerce=False,
)


@dataclass(kw_only=True, slots=True)
class DatasetIndex:
    """Parsed ``index.json`` of one shard directory."""

    root: str
    """URL of the shard directory (shards are ``root/name``)."""
    shards: pd.DataFrame
    """One row per shard: name, n_samples, bytes, sha256."""
    samples: pd.DataFrame
    """One row per sample in shard order: key, shard, offset, length, frames, height, width,
    latent_shape ([C, T, H, W] or None)."""
    embedding_dim: int
    """Width of every ``txt_emb.npy`` row."""
    meta: dict[str, Any] = field(default_factory=dict)
    """Free-form provenance (writer, embedder, source manifest)."""
    sidecars: pd.DataFrame | None = None
    """Foreign datasets only: one row per sidecar tar (name, n_samples, bytes, sha256) holding
    the caption embeddings the samples' ``emb_*`` columns point into; None otherwise."""
    integrity: str = "written"
    """What :func:`~vfm_core.data.index.read_index` found of the index's own checksums:
    ``sealed`` (they match), ``unsealed`` (an index of an older vfm has none), ``edited`` (fields
    other than the shard table changed since it was written), ``shards_edited`` (the shard or
    sidecar table changed); ``written`` for an index built in memory."""
    _columns: dict[str, list] | None = field(default=None, init=False, repr=False, compare=False)
    """``samples`` as one list per column, built at the first :meth:`row` (a loader reads three
    fields of every sample; pandas' row access took ~0.2 ms a call, 15% of a loader step)."""
    _shard_names: list[str] | None = field(default=None, init=False, repr=False, compare=False)

    def __len__(self) -> int:
        return len(self.samples)

    @property
    def checksummed(self) -> bool:
        """Every sample carries a per-sample checksum (indexes of older vfm versions have none)."""
        if "checksum" not in self.samples.columns:
            return False
        return bool(self.samples["checksum"].notna().all())

    @property
    def foreign(self) -> bool:
        """True for a foreign WebDataset indexed by ``vfm index`` (two byte ranges per sample)."""
        return "emb_shard" in self.samples.columns

    @property
    def stats(self) -> dict[str, Any] | None:
        """Summary stats written with a columnar index (distinct geometries, latent channels;
        see :mod:`vfm_core.data.columnar`); None for a JSON index (callers scan the rows)."""
        return None

    def row(self, i: int) -> dict[str, Any]:
        """Sample ``i`` as a dict of its columns (``latent_shape``: [C, T, H, W] or None), as
        ``samples.iloc[i].to_dict()`` has it (the table is not changed after it is read)."""
        if self._columns is None:
            self._columns = {c: self.samples[c].tolist() for c in self.samples.columns}
        return {c: v[i] for c, v in self._columns.items()}

    def geometry(self, i: int) -> np.ndarray:
        """(7,) frames, height, width, latent C, T, H, W (0 without a stored latent)."""
        r = self.samples.iloc[i]
        lat = r["latent_shape"] if isinstance(r["latent_shape"], list) else [0, 0, 0, 0]
        return np.array([r["frames"], r["height"], r["width"], *lat], np.int64)

    def iter_geometries(self) -> Iterator[np.ndarray]:
        """(n, 7) geometry chunks over all samples in order (a whole-table scan: fallback only)."""
        rows = self.samples
        lat = np.zeros((len(rows), 4), np.int64)
        for j, shape in enumerate(rows["latent_shape"]):
            if isinstance(shape, list):
                lat[j] = shape
        base = rows[["frames", "height", "width"]].to_numpy(np.int64)
        yield np.concatenate([base, lat], 1)

    def latent_channels(self) -> set[int]:
        """Channel counts of the stored latents (empty: no sample has one); from the stats when
        the index has them, else a scan."""
        channels = (self.stats or {}).get("latent_channels")
        if channels is not None:
            return {int(c) for c in channels}
        return {int(c) for g in self.iter_geometries() for c in np.unique(g[:, 3]) if c > 0}

    def shard_url(self, shard: int) -> str:
        if self._shard_names is None:
            self._shard_names = [str(n) for n in self.shards["name"]]
        return storage.join(self.root, self._shard_names[shard])

    def sidecar_url(self, sidecar: int) -> str:
        assert self.sidecars is not None
        return storage.join(self.root, str(self.sidecars.at[sidecar, "name"]))

    def fingerprint(self) -> str:
        """Short hash of the shard (and sidecar) checksums: a loader state is only valid for this
        dataset (re-indexing with another caption encoder changes it)."""
        shas = "".join(self.shards["sha256"])
        if self.sidecars is not None:
            shas += "+" + "".join(self.sidecars["sha256"])
        return storage.bytes_hash(shas.encode())

    def to_json(self) -> str:
        samples = self.samples.to_dict(orient="records")
        for r in samples if "checksum" in self.samples.columns else []:
            if not isinstance(r["checksum"], str):
                r["checksum"] = None  # a missing checksum is null, not NaN
        doc = {
            "schema_version": SCHEMA_VERSION,
            "embedding_dim": self.embedding_dim,
            "n_samples": len(self.samples),
            "shards": self.shards.to_dict(orient="records"),
            "samples": samples,
            "meta": self.meta,
        }
        if self.sidecars is not None:
            doc["sidecars"] = self.sidecars.to_dict(orient="records")
        return json.dumps(seal(doc), indent=1)


def _digest(obj: Any) -> str:
    return hashlib.sha256(
        json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()
    ).hexdigest()


def seal(doc: dict[str, Any]) -> dict[str, Any]:
    """``doc`` (an ``index.json`` document) with its own checksums under :data:`INTEGRITY_KEY`:
    of the shard (+ sidecar) table, and of everything else too."""
    body = {k: v for k, v in doc.items() if k != INTEGRITY_KEY}
    tables = [body.get("shards"), body.get("sidecars")]
    return {
        **body,
        INTEGRITY_KEY: {"shards_sha256": _digest(tables), "index_sha256": _digest(body)},
    }


def _check_ranges(
    table: pd.DataFrame,
    shard: pd.Series,
    offset: pd.Series,
    length: pd.Series,
    *,
    what: str,
    where: str,
) -> None:
    """Per-table sample counts agree with the samples' ``shard`` column; ranges fit the files."""
    counts = shard.groupby(shard).size().reindex(range(len(table)), fill_value=0)
    bad = [i for i, n in enumerate(counts) if n != table.at[i, "n_samples"]]
    if bad or shard.max() >= len(table):
        raise DatasetIndexError(f"{where}: per-{what} sample counts disagree with the sample table")
    ends = offset + length
    sizes = table["bytes"].to_numpy()[shard.to_numpy()]
    if (ends.to_numpy() > sizes).any():
        raise DatasetIndexError(f"{where}: a sample's byte range runs past the end of its {what}")


def validate_tables(
    shards: pd.DataFrame,
    samples: pd.DataFrame,
    *,
    where: str,
    sidecars: pd.DataFrame | None = None,
) -> None:
    """pandera checks of the tables plus cross-checks (sample counts per shard, ranges); for a
    foreign dataset also the sidecar table and the samples' second byte range."""
    present = [c for c in FOREIGN_COLUMNS if c in samples.columns]
    partial = bool(present) and len(present) != len(FOREIGN_COLUMNS)
    if partial or bool(present) != (sidecars is not None):
        raise DatasetIndexError(
            f"{where}: a foreign dataset needs all of the sample columns {list(FOREIGN_COLUMNS)} "
            f"and a sidecars table (has columns {present}, sidecars: {sidecars is not None})"
        )
    if samples.empty:
        raise DatasetIndexError(f"{where}: no samples (the index lists none)")
    validate_schema(ShardTable, shards, where=where, table="shards")
    validate_schema(SampleTable, samples, where=where, table="samples")
    if sidecars is not None:
        validate_schema(SidecarTable, sidecars, where=where, table="sidecars")
    s = samples
    _check_ranges(shards, s["shard"], s["offset"], s["length"], what="shard", where=where)
    if sidecars is not None:
        _check_ranges(
            sidecars, s["emb_shard"], s["emb_offset"], s["emb_length"], what="sidecar", where=where
        )


def validate_schema(
    schema: pa.DataFrameSchema, df: pd.DataFrame, *, where: str, table: str
) -> None:
    """pandera's check of one table as one line: the first failure (column, check, value and
    row) and how many there are in all."""
    try:
        schema.validate(df, lazy=True)
    except pa.errors.SchemaErrors as e:
        fc = e.failure_cases
        first = fc.iloc[0]
        row = "" if pd.isna(first["index"]) else f" at row {int(first['index'])}"
        value = str(first["failure_case"])[:80]
        more = f" ({len(fc)} failures in all)" if len(fc) > 1 else ""
        raise DatasetIndexError(
            f"{where}: index fails its schema: {table} column {first['column']!r} fails "
            f"{first['check']} with {value!r}{row}{more}"
        ) from None
    except pa.errors.SchemaError as e:
        raise DatasetIndexError(
            f"{where}: index fails its schema: {table}: {str(e).splitlines()[0]}"
        ) from None
