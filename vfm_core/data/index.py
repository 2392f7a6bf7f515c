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

Here: reading and writing either form (:func:`read_index`, :func:`write_index`,
:func:`migrate_index`) and the seal check; the in-memory :class:`DatasetIndex`, its table schemas
and checks are :mod:`vfm_core.data.index_tables`, the columnar form :mod:`vfm_core.data.columnar`.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import pandas as pd

from vfm_core import storage
from vfm_core.data.index_tables import (
    INTEGRITY_KEY,
    SCHEMA_VERSION,
    DatasetIndex,
    DatasetIndexError,
    SampleTable,
    ShardTable,
    SidecarTable,
    seal,
    validate_tables,
)

COLUMNAR_VERSION = 2
"""``schema_version`` of the columnar form (``format: "parquet"``)."""
INDEX_NAME = "index.json"
INDEX_FORMATS = ("json", "parquet")
log = logging.getLogger(__name__)


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


def read_index_document(root: str) -> tuple[str, dict]:
    """(url, the JSON object) of ``root/index.json``, not yet validated (its ``meta`` can be read
    without the sample table); a DatasetIndexError names an unreadable or non-object file."""
    url = storage.join(root, INDEX_NAME)
    try:
        doc = json.loads(storage.read_bytes(url))
    except storage.StorageError as e:
        raise DatasetIndexError(f"{url}: cannot read the dataset index ({e.reason})") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise DatasetIndexError(f"{url}: not valid JSON ({e})") from None
    if not isinstance(doc, dict):
        raise DatasetIndexError(f"{url}: expected a JSON object")
    return url, doc


def read_index(root: str) -> DatasetIndex:
    """Load and validate ``root/index.json``."""
    url, doc = read_index_document(root)
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
