"""WebDataset-format shards: write from a clips manifest, read single samples by byte range.

A shard is a plain POSIX tar (``shard-000000.tar``) whose members are grouped by sample key, in
WebDataset naming: ``{key}.json`` (caption, source, span, sizes, scores), ``{key}.mp4`` (the clip;
an image is a one-frame clip), ``{key}.txt_emb.npy`` (caption embedding, float16 (L, D): L
per-token vectors, or L = 1 pooled) and optionally ``{key}.latent.npy`` (pre-encoded latents,
float32 (C, T, H, W)). Any WebDataset reader can stream these tars. The writer also records
each sample's byte range and checksum (sha256 of its tar records, 128 bits: the loader checks it
on every read) in the dataset index (:mod:`vfm_core.data.index`), so the loader reads
exactly the samples it needs (one range request on S3) instead of streaming whole shards: the
global sample order is then a free choice.

Reading lives in :mod:`vfm_core.data.shard_reader` (re-exported here): member names checked,
``.npy`` without pickle, dtype / shape / NaN checks, retried range reads.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import re
import shutil
import tarfile
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from vfm_core import storage
from vfm_core.data.index import write_index
from vfm_core.data.index_tables import DatasetIndex
from vfm_core.data.shard_reader import (  # noqa: F401  (re-exported: the reading side)
    EXTENSIONS,
    REQUIRED,
    RawSample,
    SampleError,
    ShardError,
    check_directory,
    iter_tar_keys,
    load_npy,
    parse_sample,
    read_range,
    read_raw,
    relative_files,
    sample_checksum,
    verify_shards,
)
from vfm_core.output_lock import output_lock
from vfm_core.progress import Progress

KEY_RE = re.compile(r"^[A-Za-z0-9_-]+$")
MANIFEST_COLUMNS = ("clip_id", "uri", "caption")
_log = logging.getLogger(__name__)


Embedder = Callable[[list[str]], "np.ndarray | list[np.ndarray]"]
"""Captions -> (N, D) pooled or N x (L_i, D) per-token text embeddings (stored float16)."""


@dataclass(kw_only=True, slots=True)
class ShardWriterConfig:
    """How :func:`write_shards` cuts and fills shards."""

    target_shard_bytes: int = 64 << 20
    """Start a new shard once the current one reaches this size (a sample is never split)."""
    prefix: str = "shard"
    """Shard file names are ``{prefix}-{i:06d}.tar``."""
    embed_batch: int = 64
    """Captions per call of the text embedder."""


# ------------------------------------------------------------------------------------------ writing
def _key(clip_id: Any) -> str:
    key = re.sub(r"[^A-Za-z0-9_-]", "_", str(clip_id))
    if not key:
        raise ShardError("manifest", f"clip_id {clip_id!r} gives an empty sample key")
    return key


def npy_bytes(a: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, np.ascontiguousarray(a), allow_pickle=False)
    return buf.getvalue()


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.mode = len(data), 0, 0o644
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    tar.addfile(info, io.BytesIO(data))


def _json_safe(v: Any) -> Any:
    if isinstance(v, np.generic):
        return v.item()
    if isinstance(v, np.ndarray):  # list columns of the manifest (e.g. the clip embedding)
        return [_json_safe(x) for x in v.tolist()]
    if isinstance(v, float) and not np.isfinite(v):
        return None
    return v


def _sample_meta(row: dict[str, Any], frames: int, height: int, width: int) -> dict[str, Any]:
    meta = {k: _json_safe(v) for k, v in row.items() if k not in ("latent",)}
    meta.update(frames=frames, height=height, width=width, kind="image" if frames == 1 else "video")
    return meta


def embed_captions(captions: list[str], embed: Embedder, batch: int) -> list[np.ndarray]:
    """One (L, D) float32 array per caption: pooled embedders give (N, D) -> L = 1, per-token
    encoders a list of (L_i, D) (ragged) or (N, L, D)."""
    out: list[np.ndarray] = []
    bar = Progress(len(captions), desc="embedding captions", unit="caption", logger=_log)
    for i in range(0, len(captions), batch):
        part = captions[i : i + batch]
        got = embed(part)
        bar.update(len(part))
        arrays = [np.asarray(e, dtype=np.float32) for e in got]
        if arrays and all(a.ndim == 1 for a in arrays):
            arrays = [a[None] for a in arrays]  # (1, D): one pooled vector per caption
        dims = {a.shape[-1] for a in arrays if a.ndim == 2}
        if (
            len(arrays) != len(part)
            or any(a.ndim != 2 or a.shape[0] < 1 for a in arrays)
            or (len(dims | {out[0].shape[-1]} if out else dims) != 1)
        ):
            shapes = sorted({a.shape for a in arrays})[:3]
            raise ShardError(
                "embedder",
                f"returned {len(arrays)} arrays of shapes {shapes} for "
                f"{len(part)} captions, expected (N, D) or N x (L, D)",
            )
        out.extend(arrays)
    bar.close()
    return out


class ShardWriter:
    """The one writer of tar shards: ``vfm shard`` (clips), the latent encoder (clips + latents)
    and ``vfm index`` (caption sidecars of foreign tars) all go through it.

    Samples (lists of ``(member name, bytes)``) are appended to the open shard, a new one is
    started when it reached ``target_bytes`` (a sample is never split), and a closed shard is
    uploaded to ``out_url`` (local or ``s3://``) with its size and sha256. For every sample it
    keeps the index fields: shard, byte offset and length, and the per-sample checksum
    (:func:`~vfm_core.data.shard_reader.sample_checksum` of its records; ``seed`` continues a
    hash begun elsewhere, the foreign range of a sidecar sample). Members get a fixed owner, mode
    and mtime, so the same samples give byte-identical shards."""

    def __init__(
        self,
        out_url: str,
        *,
        prefix: str = "shard",
        target_bytes: int = 64 << 20,
        tar_format: int = tarfile.USTAR_FORMAT,
    ):
        self.out_url, self.prefix, self.target_bytes = out_url, prefix, target_bytes
        self.tar_format = tar_format
        self.shards: list[dict[str, Any]] = []
        """Closed shards: name, n_samples, bytes, sha256."""
        self.samples: list[dict[str, Any]] = []
        """Every sample written: shard, offset, length, checksum (set when its shard closed)."""
        self._tmp = Path(tempfile.mkdtemp(prefix="vfm-shards-"))
        self._tar: tarfile.TarFile | None = None
        self._path: Path | None = None
        self._name = ""
        self._open: list[tuple[dict[str, Any], Any]] = []  # (row, seed hash) of the open shard

    def __enter__(self) -> ShardWriter:
        return self

    def __exit__(self, *exc: Any) -> None:
        if exc[0] is None:
            self.close()
        elif self._tar is not None:
            self._tar.close()
        shutil.rmtree(self._tmp, ignore_errors=True)

    def new_shard(self, name: str | None = None) -> None:
        """Close the open shard and start the next (``name``: its file name, default
        ``{prefix}-{i:06d}.tar``)."""
        self.close()
        name = name or f"{self.prefix}-{len(self.shards):06d}.tar"
        self._path = self._tmp / Path(name).name
        self._name = name
        self._tar = tarfile.open(self._path, "w", format=self.tar_format)

    def add(self, members: list[tuple[str, bytes]], *, seed: Any = None) -> dict[str, Any]:
        """Append one sample's members; returns its index row (``checksum`` filled in when the
        shard closes)."""
        if self._tar is None:
            self.new_shard()
        assert self._tar is not None
        start = self._tar.offset
        for name, data in members:
            _add(self._tar, name, data)
        row = {"shard": len(self.shards), "offset": start, "length": self._tar.offset - start}
        self.samples.append(row)
        self._open.append((row, seed))
        if self._tar.offset >= self.target_bytes:
            self.close()
        return row

    def close(self) -> None:
        """Close the open shard (if any): checksums, sha256, upload."""
        if self._tar is None:
            return
        self._tar.close()
        assert self._path is not None
        data = self._path.read_bytes()
        for row, seed in self._open:
            records = data[row["offset"] : row["offset"] + row["length"]]
            if seed is None:
                row["checksum"] = sample_checksum(records)
            else:
                h = seed.copy()
                h.update(records)
                row["checksum"] = h.hexdigest()[: len(sample_checksum(b""))]
        storage.put_file(self._path, storage.join(self.out_url, self._name))
        self.shards.append(
            {
                "name": self._name,
                "n_samples": len(self._open),
                "bytes": len(data),
                "sha256": hashlib.sha256(data).hexdigest(),
            }
        )
        self._path.unlink()
        self._tar, self._path, self._open = None, None, []


def remove_stale_shards(dir_url: str, prefix: str, keep: set[str]) -> list[str]:
    """Tars directly in ``dir_url`` named as :class:`ShardWriter` names them (``prefix``) that
    are not in ``keep`` (the new index's): leftovers of an earlier run with other settings,
    removed; call once the new index is in place. Returns their names, sorted."""
    if not storage.exists(dir_url):
        return []
    fs, root = storage.filesystem(dir_url)
    pattern = rf"{re.escape(prefix)}-\d{{6}}\.tar"  # the names ShardWriter gives its tars
    stale = [n for n in relative_files(dir_url) if re.fullmatch(pattern, n) and n not in keep]
    for name in stale:
        fs.rm(storage.join(root, name))
    return stale


def write_shards(
    clips: pd.DataFrame,
    out_url: str,
    *,
    embed: Embedder,
    config: ShardWriterConfig | None = None,
    latents: dict[str, np.ndarray] | None = None,
    base_url: str | None = None,
    meta: dict[str, Any] | None = None,
    index_format: str = "json",
) -> DatasetIndex:
    """Write ``clips`` (a clips manifest: ``clip_id, uri, caption`` + any metadata columns) as
    shards under ``out_url`` (local or ``s3://``) and the validated ``index.json``.

    ``uri`` may be relative to ``base_url``. ``latents`` maps clip_id -> (C, T, H, W) arrays to
    store as ``latent.npy``. Every clip is test-decoded (header + first frame, as ``vfm index``
    does at least); one that does not decode is left out and listed in the index meta
    ``rejected`` (clip_id, uri, reason). Frame count and size come from the manifest
    (``n_frames``, ``height``, ``width``) or, when absent, from that probe. ``index_format``:
    ``json`` (schema 1) or ``parquet`` (columnar, see :mod:`vfm_core.data.columnar`). One writer
    per ``out_url`` (:mod:`vfm_core.output_lock`): a second is refused, naming the first.
    """
    with output_lock(out_url, what="shards folder"):
        return _write_shards(
            clips,
            out_url,
            embed=embed,
            config=config,
            latents=latents,
            base_url=base_url,
            meta=meta,
            index_format=index_format,
        )


def _write_shards(
    clips: pd.DataFrame,
    out_url: str,
    *,
    embed: Embedder,
    config: ShardWriterConfig | None,
    latents: dict[str, np.ndarray] | None,
    base_url: str | None,
    meta: dict[str, Any] | None,
    index_format: str,
) -> DatasetIndex:
    """:func:`write_shards` once the writer lock of ``out_url`` is held."""
    from vfm_core.video.io import VideoError, probe

    cfg = config or ShardWriterConfig()
    rows, keys = _manifest_rows(clips)
    embs = embed_captions([r["caption"] for r in rows], embed, cfg.embed_batch)
    dim = int(embs[0].shape[-1])

    sample_rows: list[dict[str, Any]] = []
    kept: list[np.ndarray] = []
    rejected: list[dict[str, str]] = []
    bar = Progress(len(rows), desc="writing shards", unit="clip", logger=_log)
    with (
        bar,
        ShardWriter(out_url, prefix=cfg.prefix, target_bytes=cfg.target_shard_bytes) as writer,
    ):
        for row, key, emb in zip(rows, keys, embs):
            bar.update()
            uri, mp4 = _read_clip(row, key, base_url)
            try:
                info = probe(io.BytesIO(mp4))
            except VideoError as e:
                reason = f"clip does not decode ({e.reason})"
                _log.warning("left out clip %s (%s): %s", row["clip_id"], uri, reason)
                rejected.append({"clip_id": str(row["clip_id"]), "uri": uri, "reason": reason})
                continue
            frames, height, width = _geometry(row, info)
            doc = _sample_meta(row, frames, height, width)
            members = [
                (f"{key}.json", json.dumps(doc, sort_keys=True).encode()),
                (f"{key}.mp4", mp4),
                (f"{key}.txt_emb.npy", npy_bytes(emb.astype(np.float16))),
            ]
            lat = _checked_latent(latents, row, key)  # (C, T, H, W) float32 or None
            if lat is not None:
                members.append((f"{key}.latent.npy", npy_bytes(lat)))
            placed = writer.add(members)
            kept.append(emb)
            sample_rows.append(
                {
                    "key": key,
                    **placed,
                    "frames": frames,
                    "height": height,
                    "width": width,
                    "latent_shape": None if lat is None else list(lat.shape),
                }
            )
    if not sample_rows:
        reasons = [f"{r['clip_id']}: {r['reason']}" for r in rejected[:3]]
        raise ShardError("manifest", f"no clip decodes ({len(rejected)} left out), e.g. {reasons}")
    for r, placed in zip(sample_rows, writer.samples, strict=True):
        r["checksum"] = placed["checksum"]
    index_meta = {
        "writer": "vfm_core.data.shards",
        "caption_tokens": caption_token_stats(kept),
        **({"rejected": rejected} if rejected else {}),
        **(meta or {}),
    }
    index = _dataset_index(out_url, writer.shards, sample_rows, embedding_dim=dim, meta=index_meta)
    write_index(index, format=index_format)
    return index


def _dataset_index(
    out_url: str,
    shard_rows: list[dict[str, Any]],
    sample_rows: list[dict[str, Any]],
    *,
    embedding_dim: int,
    meta: dict[str, Any],
) -> DatasetIndex:
    """The index of the written shards (its tables from the writer's rows)."""
    samples = pd.DataFrame(sample_rows)
    samples["latent_shape"] = samples["latent_shape"].astype(object)
    return DatasetIndex(
        root=str(out_url),
        shards=pd.DataFrame(shard_rows),
        samples=samples,
        embedding_dim=embedding_dim,
        meta=meta,
    )


def _manifest_rows(clips: pd.DataFrame) -> tuple[list[dict[str, Any]], list[str]]:
    """The typed manifest rows and their sample keys; ShardError for missing columns, no clips
    or duplicate keys."""
    missing = [c for c in MANIFEST_COLUMNS if c not in clips.columns]
    if missing:
        raise ShardError("manifest", f"missing columns {missing} (has {list(clips.columns)})")
    if clips.empty:
        raise ShardError("manifest", "no clips to shard")
    rows = typed_manifest(clips).to_dict(orient="records")
    keys = [_key(r["clip_id"]) for r in rows]
    dup = sorted({k for k in keys if keys.count(k) > 1})
    if dup:
        raise ShardError("manifest", f"duplicate sample keys {dup[:5]}")
    return rows, keys


def _read_clip(row: dict[str, Any], key: str, base_url: str | None) -> tuple[str, bytes]:
    """(uri, mp4 bytes) of a manifest row, a relative uri taken under ``base_url``."""
    uri = str(row["uri"])
    if base_url and not storage.is_remote(uri) and not os.path.isabs(uri):
        uri = storage.join(base_url, uri)
    try:
        return uri, storage.read_bytes(uri)
    except storage.StorageError as e:
        raise ShardError(f"clip {key}", f"cannot read {uri} ({e.reason})") from None


def _checked_latent(
    latents: dict[str, np.ndarray] | None, row: dict[str, Any], key: str
) -> np.ndarray | None:
    """The row's latent as float32 (C, T, H, W), None without one; ShardError when it is not
    finite or not 4-D."""
    lat = None if latents is None else latents.get(str(row["clip_id"]))
    if lat is None:
        return None
    lat = np.asarray(lat, dtype=np.float32)
    if lat.ndim != 4 or not np.isfinite(lat).all():
        raise ShardError(
            f"clip {key}", f"latent must be finite (C, T, H, W), got shape {lat.shape}"
        )
    return lat


def typed_manifest(clips: pd.DataFrame) -> pd.DataFrame:
    """``clips`` with the columns of the curation contract
    (:class:`~vfm_core.contracts.AnnotatedClips`) that it has in their types: numbers stored as
    text ("12.0") become numbers, anything else that is no number (or no text, in a text column)
    is a :class:`ShardError` naming the column. A null caption is no caption: ``""``, and
    ``caption_source`` ``none`` where the manifest has that column."""
    from vfm_core.contracts import AnnotatedClips

    out = clips.copy()
    for name, col in AnnotatedClips.to_schema().columns.items():
        if name not in out.columns:
            continue
        values, numeric = out[name], col.dtype.type.is_numeric()
        if numeric and pd.api.types.is_numeric_dtype(values):
            continue
        if numeric:
            try:
                typed = pd.to_numeric(values, errors="coerce")
            except (TypeError, ValueError):  # lists, dicts: nothing converts
                typed = pd.Series(np.nan, index=values.index)
            bad = values.notna() & typed.isna()
        else:
            typed = values
            bad = values.notna() & ~values.map(lambda v: isinstance(v, str)).astype(bool)
        if bad.any():
            first = bad.idxmax()
            raise ShardError(
                "manifest",
                f"column {name!r} must hold {'numbers' if numeric else 'text'}, got "
                f"{values[first]!r} (clip {out.at[first, 'clip_id']!r}; {int(bad.sum())} "
                "rows in all)",
            )
        out[name] = typed
    uncaptioned = out["caption"].isna()
    out["caption"] = out["caption"].astype(object).where(~uncaptioned, "")
    if "caption_source" in out.columns:
        out["caption_source"] = out["caption_source"].astype(object).where(~uncaptioned, "none")
    return out


def caption_token_stats(embs: list[np.ndarray]) -> dict[str, float]:
    """Caption lengths in embedding tokens (rows of each (L, D) embedding): ``max``, ``p95``,
    ``mean`` and ``n``. Kept in the index's meta so a trainer can size ``model.text_len`` from
    the data (what the pipeline does) instead of cutting captions it never looked at."""
    lengths = np.array([e.shape[0] for e in embs], dtype=np.int64)
    return {
        "max": int(lengths.max()),
        "p95": int(np.ceil(np.percentile(lengths, 95))),
        "mean": round(float(lengths.mean()), 2),
        "n": int(lengths.size),
    }


def _geometry(row: dict[str, Any], info: Any) -> tuple[int, int, int]:
    """(frames, height, width) from the manifest, else from the clip's probe ``info``."""
    try:
        vals = [int(row[c]) for c in ("n_frames", "height", "width")]
        if all(v > 0 for v in vals):
            return vals[0], vals[1], vals[2]
    except (KeyError, TypeError, ValueError):
        pass
    return info.n_frames, info.height, info.width
