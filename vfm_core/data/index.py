"""The dataset index: which shards a dataset has, what each holds, and how to check them.

``index.json`` sits next to the shards and is the only thing the loader needs to plan an epoch:
the shard list (relative names, sizes, sha256), and per sample its key, shard, byte range inside
the tar and its geometry (frames, height, width, latent shape). Planning (global order, DP split,
packing by token count) therefore never touches the data; only the chosen byte ranges are read.

The two tables are validated with pandera on write and on read; ``schema_version`` guards the
format (a reader refuses any other version with a clear message).

Foreign WebDatasets (``vfm index``, :mod:`vfm_core.data.foreign_index`) add optional columns,
all or none: ``member_key`` (the sample's key inside the foreign tar, which may hold ``/``),
``media`` (the member extension holding the clip or image: mp4, webm, jpg, png, ...) and a second
byte range ``emb_shard`` / ``emb_offset`` / ``emb_length`` into a *sidecar* tar (table
``sidecars``, names like ``_vfm/emb-000000.tar``) holding the caption embedding. An index without
them is exactly the schema-1 index of our own shards, so existing datasets keep loading.

Integrity (issue #27), both optional so that older indexes load unchanged:

* ``checksum`` (sample column): the first 32 hex digits of the sha256 of the sample's tar records
  (both ranges of a foreign sample), computed when the shard is written (foreign tars: when
  indexed); the loader checks it on every read (:func:`~vfm_core.data.shard_reader.check_sample`).
* ``integrity`` (top level of ``index.json``): sha256 of the shard (+ sidecar) table and of the
  whole document, written last. :func:`read_index` compares them and records the outcome in
  :attr:`DatasetIndex.integrity`: an edited shard table (a shard's sha256 or size changed by hand)
  makes the loader check every shard's sha256 before trusting it; other edits are one warning.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
import pandera.pandas as pa

from vfm_core import storage
from vfm_core.errors import UserError

SCHEMA_VERSION = 1
COLUMNAR_VERSION = 2
"""``schema_version`` of the columnar form (``format: "parquet"``)."""
INDEX_NAME = "index.json"
INDEX_FORMATS = ("json", "parquet")
INTEGRITY_KEY = "integrity"
"""Top-level key of ``index.json`` holding its own checksums (see the module docstring)."""
log = logging.getLogger(__name__)


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
"""Optional sample columns of a foreign dataset (all or none; see the module docstring)."""

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
    """What :func:`read_index` found of the index's own checksums: ``sealed`` (they match),
    ``unsealed`` (an index of an older vfm has none), ``edited`` (fields other than the shard
    table changed since it was written), ``shards_edited`` (the shard or sidecar table changed);
    ``written`` for an index built in memory."""
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


def check_seal(doc: dict[str, Any], url: str) -> str:
    """Compare a parsed ``index.json`` with its own checksums (see :attr:`DatasetIndex.integrity`
    for the outcomes); an edit is one warning line naming the index."""
    record = doc.get(INTEGRITY_KEY)
    if not isinstance(record, dict):
        return "unsealed"
    again = seal(doc)[INTEGRITY_KEY]
    if again["shards_sha256"] != record.get("shards_sha256"):
        log.warning(
            "%s: the shard table was edited after the index was written (its checksum does not "
            "match): every shard's sha256 is checked before the data is trusted",
            url,
        )
        return "shards_edited"
    if again["index_sha256"] != record.get("index_sha256"):
        log.warning(
            "%s: edited after it was written (its checksum does not match; the shard table is "
            "intact and every sample is still checked against its own checksum)",
            url,
        )
        return "edited"
    return "sealed"


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


def index_writer(root: str) -> str | None:
    """``meta.writer`` of the ``index.json`` already in ``root`` (which tool wrote it): None when
    there is none, "" when it is no readable index."""
    url = storage.join(root, INDEX_NAME)
    if not storage.exists(url):
        return None
    try:
        writer = json.loads(storage.read_bytes(url)).get("meta", {}).get("writer")
    except (storage.StorageError, json.JSONDecodeError, UnicodeDecodeError, AttributeError):
        return ""
    return writer if isinstance(writer, str) else ""


def read_index(root: str) -> DatasetIndex:
    """Load and validate ``root/index.json``."""
    url = storage.join(root, INDEX_NAME)
    try:
        doc = json.loads(storage.read_bytes(url))
    except storage.StorageError as e:
        raise DatasetIndexError(f"{url}: cannot read the dataset index ({e.reason})") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise DatasetIndexError(f"{url}: not valid JSON ({e})") from None
    if not isinstance(doc, dict):
        raise DatasetIndexError(f"{url}: expected a JSON object")
    version = doc.get("schema_version")
    if version == COLUMNAR_VERSION and doc.get("format") == "parquet":
        from vfm_core.data.columnar import open_parquet_index

        index = open_parquet_index(url, doc, str(root))
        index.integrity = check_seal(doc, url)
        return index
    if version != SCHEMA_VERSION:
        raise DatasetIndexError(
            f"{url}: schema_version {version!r}, this reader understands {SCHEMA_VERSION} "
            f"(json) and {COLUMNAR_VERSION} with format 'parquet' (this one has format "
            f"{doc.get('format')!r}; re-shard the data with this version of vfm)"
        )
    try:
        shards = pd.DataFrame(doc["shards"], columns=list(ShardTable.columns))
        rows = doc["samples"]
        # optional (foreign) columns: those the first sample carries (validation wants all rows)
        first = rows[0] if isinstance(rows, list) and rows and isinstance(rows[0], dict) else {}
        cols = [c for c, col in SampleTable.columns.items() if col.required or c in first]
        samples = pd.DataFrame(rows, columns=cols)
        dim = int(doc["embedding_dim"])
        sidecars = None
        if doc.get("sidecars") is not None:
            sidecars = pd.DataFrame(doc["sidecars"], columns=list(SidecarTable.columns))
    except (KeyError, TypeError, ValueError) as e:
        raise DatasetIndexError(f"{url}: missing or malformed field ({e})") from None
    samples["latent_shape"] = samples["latent_shape"].astype(object)
    validate_tables(shards, samples, where=url, sidecars=sidecars)
    return DatasetIndex(
        root=str(root),
        shards=shards,
        samples=samples,
        embedding_dim=dim,
        meta=doc.get("meta", {}),
        sidecars=sidecars,
        integrity=check_seal(doc, url),
    )


def write_index(index: DatasetIndex, *, format: str = "json", row_group_size: int = 1 << 14) -> str:
    """Validate and atomically write ``index.json`` (``format="parquet"``: the columnar form,
    ``samples.parquet`` in row groups of ``row_group_size`` first, then the small ``index.json``
    naming it); returns its URL."""
    if format not in INDEX_FORMATS:
        raise ValueError(f"index format {format!r}: one of {INDEX_FORMATS}")
    url = storage.join(index.root, INDEX_NAME)
    validate_tables(index.shards, index.samples, where=url, sidecars=index.sidecars)
    if format == "json":
        return storage.write_bytes(url, index.to_json().encode())
    from vfm_core.data.columnar_writer import SAMPLES_NAME, frame_to_arrow, write_samples

    foreign = index.sidecars is not None
    stats = write_samples(
        storage.join(index.root, SAMPLES_NAME),
        [frame_to_arrow(index.samples, foreign)],
        foreign=foreign,
        row_group_size=row_group_size,
    )
    doc = columnar_doc(
        index.shards,
        index.sidecars,
        embedding_dim=index.embedding_dim,
        meta=index.meta,
        stats=stats,
    )
    return storage.write_bytes(url, json.dumps(doc, indent=1).encode())


def columnar_doc(
    shards: pd.DataFrame,
    sidecars: pd.DataFrame | None,
    *,
    embedding_dim: int,
    meta: dict[str, Any],
    stats: dict[str, Any],
) -> dict[str, Any]:
    """The small ``index.json`` of the columnar form."""
    from vfm_core.data.columnar_writer import SAMPLES_NAME

    doc = {
        "schema_version": COLUMNAR_VERSION,
        "format": "parquet",
        "samples_file": SAMPLES_NAME,
        "embedding_dim": embedding_dim,
        "n_samples": stats["n_samples"],
        "row_group_size": stats["row_group_size"],
        "shards": shards.to_dict(orient="records"),
        "meta": meta,
        "stats": {k: v for k, v in stats.items() if k not in ("n_samples", "row_group_size")},
    }
    if sidecars is not None:
        doc["sidecars"] = sidecars.to_dict(orient="records")
    return seal(doc)


def migrate_index(root: str, *, row_group_size: int = 1 << 14) -> dict[str, Any]:
    """Convert the JSON index of ``root`` to the columnar form in place (the old ``index.json``
    is kept as ``index.v1.json``); the result is read back. Returns a summary."""
    index = read_index(root)
    if index.stats is not None:
        return {"index": storage.join(root, INDEX_NAME), "n_samples": len(index), "migrated": False}
    storage.write_bytes(storage.join(root, "index.v1.json"), index.to_json().encode())
    url = write_index(index, format="parquet", row_group_size=row_group_size)
    again = read_index(root)
    if len(again) != len(index):
        raise DatasetIndexError(f"{url}: migrated index reads back {len(again)} samples")
    return {"index": url, "n_samples": len(again), "migrated": True}
