"""The clips manifest as clip search reads it: ``CLIPS_DIR/clips.parquet`` (local or s3://), its
digest (the cache key), the caption and embedding columns as arrays, and subsets of it.

Only ``clip_id`` and ``uri`` are required; text search needs ``caption`` (rows with an empty
caption are not searchable), ``--like`` needs ``embedding`` (list[float], one length).
"""

from __future__ import annotations

import io
import os
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from vfm_core import storage
from vfm_core.search.errors import SearchError

MANIFEST = "clips.parquet"


@dataclass(kw_only=True, slots=True)
class Manifest:
    """A read clips manifest."""

    clips_dir: str
    """The folder (local path or s3:// URL) as given."""
    url: str
    """``clips_dir/clips.parquet``."""
    digest: str
    """sha256 of the parquet bytes (16 hex digits): any change of the manifest changes it."""
    table: pa.Table
    """The rows, schema as written by curation."""

    def __len__(self) -> int:
        return self.table.num_rows

    def column(self, name: str) -> list:
        return self.table.column(name).to_pylist()

    def row_of(self, clip_id: str) -> int:
        """Row number of ``clip_id``; :class:`SearchError` naming it when absent."""
        ids = self.table.column("clip_id")
        # pc.index, not indices_nonzero(equal(...)): that one segfaults on a 0-row column
        row = pc.index(ids, pa.scalar(str(clip_id), ids.type)).as_py()
        if row < 0:
            raise SearchError(f"--like: no clip {clip_id!r} in {self.url} ({len(self)} clips)")
        return row

    def resolve_uri(self, uri: str) -> str:
        """A clip ``uri`` as written (absolute, a URL, or relative to the clips dir) made usable
        from anywhere: absolute local path or URL."""
        uri = str(uri)
        if storage.is_remote(uri) or os.path.isabs(uri.removeprefix("file://")):
            return uri
        joined = storage.join(self.clips_dir, uri)
        return joined if storage.is_remote(joined) else os.path.abspath(joined)


def read_manifest(clips_dir: str) -> Manifest:
    """``clips_dir/clips.parquet``; :class:`SearchError` naming the folder when it is no folder or
    has none, the file is not parquet (or no regular file: a FIFO is refused unopened), or it
    lacks ``clip_id`` / ``uri`` or its clip ids are not strings."""
    clips_dir = str(clips_dir)
    expected = "expected a curated clips dir (the DST of vfm curate)"
    local = None if storage.is_remote(clips_dir) else clips_dir.removeprefix("file://")
    if local is not None and os.path.exists(local) and not os.path.isdir(local):
        raise SearchError(f"{clips_dir}: not a folder; {expected}")
    url = storage.join(clips_dir, MANIFEST)
    try:
        data = storage.read_bytes(url)
    except storage.StorageError as e:
        raise SearchError(f"{clips_dir}: no readable {MANIFEST} ({e.reason}); {expected}") from None
    try:
        table = storage.parquet_table(data)
    except (pa.ArrowException, OSError, ValueError) as e:
        raise SearchError(f"{url}: not a parquet file ({e})") from None
    missing = [c for c in ("clip_id", "uri") if c not in table.column_names]
    if missing:
        raise SearchError(f"{url}: no {', '.join(missing)} column(s); not a clips manifest")
    id_type = table.schema.field("clip_id").type
    if not (pa.types.is_string(id_type) or pa.types.is_large_string(id_type)):
        raise SearchError(f"{url}: clip_id column is {id_type}, expected strings")
    return Manifest(clips_dir=clips_dir, url=url, digest=storage.bytes_hash(data), table=table)


def caption_rows(m: Manifest) -> tuple[np.ndarray, list[str]]:
    """(row numbers (R,) int64, captions) of the rows with a non-empty caption."""
    if "caption" not in m.table.column_names:
        raise SearchError(
            f"{m.url}: no caption column; text search needs captions "
            "(--like CLIP_ID searches by clip embedding)"
        )
    caps = m.column("caption")
    rows = [i for i, c in enumerate(caps) if isinstance(c, str) and c.strip()]
    if not rows:
        raise SearchError(
            f"{m.url}: all {len(m)} captions are empty; text search needs captions "
            "(--like CLIP_ID searches by clip embedding)"
        )
    return np.asarray(rows, np.int64), [caps[i].strip() for i in rows]


def _is_vector_type(t: pa.DataType) -> bool:
    t_ = pa.types
    is_list = t_.is_list(t) or t_.is_large_list(t) or t_.is_fixed_size_list(t)
    return is_list and (t_.is_floating(t.value_type) or t_.is_integer(t.value_type))


def embedding_rows(m: Manifest) -> tuple[np.ndarray, np.ndarray]:
    """(row numbers (R,) int64, clip embeddings (R, D) float32) of the rows with an embedding."""
    name = "embedding"
    if name not in m.table.column_names:
        raise SearchError(
            f"{m.url}: no {name} column; --like needs clip embeddings "
            "(a text query searches captions)"
        )
    col = m.table.column(name).combine_chunks()
    if not _is_vector_type(col.type):
        raise SearchError(f"{m.url}: {name} column is {col.type}, expected list of floats")
    valid = np.asarray(col.is_valid(), dtype=bool)
    lengths = np.asarray(pc.fill_null(pc.list_value_length(col), 0), dtype=np.int64)  # (N,)
    rows = np.flatnonzero(valid & (lengths > 0))
    if len(rows) == 0:
        raise SearchError(f"{m.url}: no clip has an {name}; --like needs clip embeddings")
    dim = int(lengths[rows[0]])
    bad = rows[lengths[rows] != dim]
    if len(bad):
        clip = m.table.column("clip_id")[int(bad[0])].as_py()
        raise SearchError(
            f"{m.url}: clip {clip!r} has a {lengths[bad[0]]}-d {name}, others {dim}-d"
        )
    flat = col.take(pa.array(rows)).flatten()  # (R * D,)
    vectors = np.asarray(flat.to_numpy(zero_copy_only=False), np.float32).reshape(len(rows), dim)
    if not np.isfinite(vectors).all():
        i = int(rows[np.flatnonzero(~np.isfinite(vectors).all(axis=1))[0]])
        clip = m.table.column("clip_id")[i].as_py()
        raise SearchError(f"{m.url}: clip {clip!r} has a non-finite {name}")
    return rows.astype(np.int64), vectors


def subset(m: Manifest, rows: list[int]) -> pa.Table:
    """The manifest's ``rows`` in that order, same schema, ``uri`` made absolute (so the subset
    can live in another folder)."""
    table = m.table.take(pa.array(rows, pa.int64()))
    uris = pa.array(
        [m.resolve_uri(u) for u in table.column("uri").to_pylist()], table.schema.field("uri").type
    )
    return table.set_column(table.schema.get_field_index("uri"), "uri", uris)


def write_table(table: pa.Table, out_dir: str) -> str:
    """``out_dir/clips.parquet`` (atomic; local or s3://); returns its URL."""
    buf = io.BytesIO()
    pq.write_table(table, buf)
    return storage.write_bytes(storage.join(str(out_dir), MANIFEST), buf.getvalue())
