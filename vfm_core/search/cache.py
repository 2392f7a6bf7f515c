"""The built indexes of a clips dir, cached beside its manifest:

    CLIPS_DIR/_search/{field}-{key}/    meta.json + vectors.npy | index.faiss   (the index)
                                        rows.json  {"key", "manifest", "rows": [row numbers]}

``field`` is ``caption`` (caption text embeddings) or ``embedding`` (the clip embedding column);
``key`` digests the manifest's bytes, the field, the index config and the text model, so a changed
manifest (or config) never reads a stale index: it builds one under a new key and removes the
``{field}-*`` folders of other manifests (those of the same manifest under another index config
stay, one per config). ``rows.json`` is written last: a folder without it is incomplete and
rebuilt. Every file carries a checksum (the index's data file in its ``meta.json``, the rows in
``rows.json``): a cached index whose bytes changed (flipped bytes in ``index.faiss`` load fine and
answer with impossible scores and the wrong clips) is rebuilt, with one warning line. A clips dir
that cannot be written (read-only, no S3 write permission) still searches: the index is built in
memory and a warning logged.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from vfm_core import storage
from vfm_core.search.errors import SearchError
from vfm_core.search.index import IndexConfig, VectorIndex, build_index, load_index
from vfm_core.search.manifest import Manifest

CACHE_DIR = "_search"
ROWS = "rows.json"
log = logging.getLogger(__name__)


@dataclass(kw_only=True, slots=True)
class CachedIndex:
    """An index over some manifest rows and where it lives."""

    index: VectorIndex
    rows: np.ndarray
    """(R,) int64: manifest row number of each index position."""
    url: str
    """Its cache folder."""
    built: bool
    """True when built by this call, False when loaded from the cache."""


def cache_key(manifest: Manifest, field: str, config: IndexConfig, model: str) -> str:
    blob = json.dumps(
        {
            "manifest": manifest.digest,
            "field": field,
            "model": model,
            "index": dataclasses.asdict(config),
            "v": 2,  # 2: checksummed files (older folders are rebuilt, then pruned)
        },
        sort_keys=True,
    )
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _load(url: str, key: str) -> CachedIndex | None:
    try:
        meta = json.loads(storage.read_bytes(storage.join(url, ROWS)))
        if meta.get("key") != key:
            return None
        if meta.get("rows_sha256") != _rows_digest(meta["rows"]):
            raise ValueError(f"{ROWS} does not match its checksum (corrupt or edited)")
        index = load_index(url)
        rows = np.asarray(meta["rows"], np.int64)  # (R,)
    except (storage.StorageError, SearchError, ValueError, KeyError) as e:
        if not isinstance(e, storage.StorageError):  # absent is normal; damaged is worth a line
            log.warning("rebuilding the search index %s: %s", url, e)
        return None
    if len(rows) != len(index):
        log.warning(
            "rebuilding the search index %s: %d rows for %d vectors", url, len(rows), len(index)
        )
        return None
    return CachedIndex(index=index, rows=rows, url=url, built=False)


def _rows_digest(rows: object) -> str:
    return hashlib.sha256(json.dumps(rows, separators=(",", ":")).encode()).hexdigest()


def _same_manifest(fs, folder: str, digest: str) -> bool:
    """Whether the cached index in ``folder`` is complete and of the manifest ``digest``."""
    try:
        with fs.open(f"{folder}/{ROWS}", "rb") as f:
            return json.loads(f.read()).get("manifest") == digest
    except (OSError, ValueError, AttributeError):
        return False


def _prune(root: str, field: str, keep: str, digest: str) -> None:
    """Remove the ``root/{field}-*`` folders other than ``keep`` that are not a complete index of
    the same manifest (``digest``): those of another manifest, or unfinished (best effort). An
    index of the same manifest under another config (exact / faiss) stays, so alternating
    between them loads each instead of rebuilding it."""
    try:
        fs, path = storage.filesystem(root)
        for p in fs.ls(path, detail=False):
            name = str(p).rstrip("/").rsplit("/", 1)[-1]
            if name.startswith(f"{field}-") and name != keep:
                if not _same_manifest(fs, str(p).rstrip("/"), digest):
                    fs.rm(p, recursive=True)
    except (OSError, ValueError) as e:
        log.warning("could not remove old search indexes under %s: %s", root, e)


def cached_index(
    manifest: Manifest,
    field: str,
    config: IndexConfig,
    vectors: Callable[[], tuple[np.ndarray, np.ndarray]],
    *,
    model: str = "",
    use_cache: bool = True,
) -> CachedIndex:
    """The index of ``field`` for ``manifest``: loaded from the cache when its key matches, else
    built from ``vectors()`` -> (rows (R,), vectors (R, D)) and saved."""
    key = cache_key(manifest, field, config, model)
    root = storage.join(manifest.clips_dir, CACHE_DIR)
    url = storage.join(root, f"{field}-{key}")
    if use_cache and (found := _load(url, key)) is not None:
        return found
    rows, vecs = vectors()
    index = build_index(vecs, config)
    if use_cache:
        try:
            index.save(url)
            rows_meta = {
                "key": key,
                "manifest": manifest.digest,
                "field": field,
                "rows": rows.tolist(),
                "rows_sha256": _rows_digest(rows.tolist()),
            }
            storage.write_bytes(storage.join(url, ROWS), json.dumps(rows_meta).encode())
            _prune(root, field, keep=f"{field}-{key}", digest=manifest.digest)
        except OSError as e:  # StorageError included: read-only clips dir
            log.warning("search index not cached in %s: %s", url, e)
    return CachedIndex(index=index, rows=rows, url=url, built=True)
