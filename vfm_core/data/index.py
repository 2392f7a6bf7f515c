"""The dataset index: which shards a dataset has, what each holds, and how to check them.

``index.json`` sits next to the shards and is the only thing the loader needs to plan an epoch:
the shard list (relative names, sizes, sha256), and per sample its key, shard, byte range inside
the tar and its geometry (frames, height, width, latent shape). Planning (global order, DP split,
packing by token count) therefore never touches the data; only the chosen byte ranges are read.

The two tables are validated with pandera on write and on read; ``schema_version`` guards the
format (a reader refuses any other version with a clear message).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import pandas as pd
import pandera.pandas as pa

from vfm_core import storage

SCHEMA_VERSION = 1
INDEX_NAME = "index.json"


class DatasetIndexError(ValueError):
    """An index that is missing, malformed, of another schema version or disagrees with its
    shards; the message names the index URL and the problem."""


def _is_latent_shape(v: object) -> bool:
    return isinstance(v, list) and len(v) == 4 and all(type(x) is int and x > 0 for x in v)


ShardTable = pa.DataFrameSchema(
    {
        "name": pa.Column(str, pa.Check.str_matches(r"^[A-Za-z0-9_.-]+\.tar$"), unique=True),
        "n_samples": pa.Column(int, pa.Check.gt(0)),
        "bytes": pa.Column(int, pa.Check.gt(0)),
        "sha256": pa.Column(str, pa.Check.str_matches(r"^[0-9a-f]{64}$")),
    },
    strict=True,
    coerce=False,
)

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

    def __len__(self) -> int:
        return len(self.samples)

    def shard_url(self, shard: int) -> str:
        return storage.join(self.root, str(self.shards.at[shard, "name"]))

    def fingerprint(self) -> str:
        """Short hash of the shard checksums: a loader state is only valid for this dataset."""
        return storage.bytes_hash("".join(self.shards["sha256"]).encode())

    def to_json(self) -> str:
        samples = self.samples.to_dict(orient="records")
        return json.dumps(
            {
                "schema_version": SCHEMA_VERSION,
                "embedding_dim": self.embedding_dim,
                "n_samples": len(self.samples),
                "shards": self.shards.to_dict(orient="records"),
                "samples": samples,
                "meta": self.meta,
            },
            indent=1,
        )


def validate_tables(shards: pd.DataFrame, samples: pd.DataFrame, *, where: str) -> None:
    """pandera checks of both tables plus cross-checks (sample counts per shard, ranges)."""
    try:
        ShardTable.validate(shards, lazy=True)
        SampleTable.validate(samples, lazy=True)
    except (pa.errors.SchemaErrors, pa.errors.SchemaError) as e:
        raise DatasetIndexError(f"{where}: index fails its schema:\n{_short(e)}") from None
    counts = samples.groupby("shard").size().reindex(range(len(shards)), fill_value=0)
    bad = [i for i, n in enumerate(counts) if n != shards.at[i, "n_samples"]]
    if bad or samples["shard"].max() >= len(shards):
        raise DatasetIndexError(f"{where}: per-shard sample counts disagree with the sample table")
    ends = samples["offset"] + samples["length"]
    sizes = shards["bytes"].to_numpy()[samples["shard"].to_numpy()]
    if (ends.to_numpy() > sizes).any():
        raise DatasetIndexError(f"{where}: a sample's byte range runs past the end of its shard")


def _short(e: Exception) -> str:
    text = str(e)
    return text if len(text) < 1500 else text[:1500] + " ..."


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
    if version != SCHEMA_VERSION:
        raise DatasetIndexError(
            f"{url}: schema_version {version!r}, this reader understands {SCHEMA_VERSION} "
            "(re-shard the data with this version of vfm)"
        )
    try:
        shards = pd.DataFrame(doc["shards"], columns=list(ShardTable.columns))
        samples = pd.DataFrame(doc["samples"], columns=list(SampleTable.columns))
        dim = int(doc["embedding_dim"])
    except (KeyError, TypeError, ValueError) as e:
        raise DatasetIndexError(f"{url}: missing or malformed field ({e})") from None
    samples["latent_shape"] = samples["latent_shape"].astype(object)
    validate_tables(shards, samples, where=url)
    return DatasetIndex(
        root=str(root), shards=shards, samples=samples, embedding_dim=dim, meta=doc.get("meta", {})
    )


def write_index(index: DatasetIndex) -> str:
    """Validate and atomically write ``index.json``; returns its URL."""
    url = storage.join(index.root, INDEX_NAME)
    validate_tables(index.shards, index.samples, where=url)
    return storage.write_bytes(url, index.to_json().encode())
