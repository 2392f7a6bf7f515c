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
import os
import re
import tarfile
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from vfm_core import storage
from vfm_core.data.index import DatasetIndex, write_index
from vfm_core.data.shard_reader import (  # noqa: F401  (re-exported: the reading side)
    EXTENSIONS,
    REQUIRED,
    RawSample,
    SampleError,
    ShardError,
    iter_tar_keys,
    load_npy,
    parse_sample,
    read_range,
    read_raw,
    sample_checksum,
    verify_shards,
)

KEY_RE = re.compile(r"^[A-Za-z0-9_-]+$")
MANIFEST_COLUMNS = ("clip_id", "uri", "caption")


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
    for i in range(0, len(captions), batch):
        part = captions[i : i + batch]
        got = embed(part)
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
    return out


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
    store as ``latent.npy``. Frame count and size come from the manifest (``n_frames``,
    ``height``, ``width``) or, when absent, from probing the clip. ``index_format``: ``json``
    (schema 1) or ``parquet`` (columnar, see :mod:`vfm_core.data.columnar`).
    """
    from vfm_core.video.io import VideoError, probe

    cfg = config or ShardWriterConfig()
    missing = [c for c in MANIFEST_COLUMNS if c not in clips.columns]
    if missing:
        raise ShardError("manifest", f"missing columns {missing} (has {list(clips.columns)})")
    if clips.empty:
        raise ShardError("manifest", "no clips to shard")
    rows = clips.to_dict(orient="records")
    keys = [_key(r["clip_id"]) for r in rows]
    dup = sorted({k for k in keys if keys.count(k) > 1})
    if dup:
        raise ShardError("manifest", f"duplicate sample keys {dup[:5]}")
    captions = ["" if pd.isna(r["caption"]) else str(r["caption"]) for r in rows]
    embs = embed_captions(captions, embed, cfg.embed_batch)
    dim = int(embs[0].shape[-1])

    shard_rows: list[dict[str, Any]] = []
    sample_rows: list[dict[str, Any]] = []
    tmpdir = Path(tempfile.mkdtemp(prefix="vfm-shards-"))
    tar: tarfile.TarFile | None = None
    tar_path: Path | None = None
    n_in_shard = 0

    def close_shard() -> None:
        nonlocal tar, n_in_shard
        assert tar is not None and tar_path is not None
        tar.close()
        name = tar_path.name
        data = tar_path.read_bytes()
        digest = hashlib.sha256(data).hexdigest()
        for r in sample_rows[len(sample_rows) - n_in_shard :]:  # this shard's samples
            r["checksum"] = sample_checksum(data[r["offset"] : r["offset"] + r["length"]])
        storage.put_file(tar_path, storage.join(out_url, name))
        shard_rows.append(
            {
                "name": name,
                "n_samples": n_in_shard,
                "bytes": tar_path.stat().st_size,
                "sha256": digest,
            }
        )
        tar_path.unlink()
        tar, n_in_shard = None, 0

    try:
        for row, key, emb in zip(rows, keys, embs):
            uri = str(row["uri"])
            if base_url and not storage.is_remote(uri) and not os.path.isabs(uri):
                uri = storage.join(base_url, uri)
            try:
                mp4 = storage.read_bytes(uri)
            except storage.StorageError as e:
                raise ShardError(f"clip {key}", f"cannot read {uri} ({e.reason})") from None
            frames, height, width = _geometry(row, mp4, uri, probe, VideoError)
            if tar is None:
                tar_path = tmpdir / f"{cfg.prefix}-{len(shard_rows):06d}.tar"
                tar = tarfile.open(tar_path, "w", format=tarfile.USTAR_FORMAT)
            start = tar.offset
            doc = _sample_meta(row, frames, height, width)
            members = [
                (f"{key}.json", json.dumps(doc, sort_keys=True).encode()),
                (f"{key}.mp4", mp4),
                (f"{key}.txt_emb.npy", npy_bytes(emb.astype(np.float16))),
            ]
            lat = None if latents is None else latents.get(str(row["clip_id"]))
            if lat is not None:
                lat = np.asarray(lat, dtype=np.float32)
                if lat.ndim != 4 or not np.isfinite(lat).all():
                    raise ShardError(
                        f"clip {key}", f"latent must be finite (C, T, H, W), got shape {lat.shape}"
                    )
                members.append((f"{key}.latent.npy", npy_bytes(lat)))
            for name, data in members:
                _add(tar, name, data)
            sample_rows.append(
                {
                    "key": key,
                    "shard": len(shard_rows),
                    "offset": start,
                    "length": tar.offset - start,
                    "frames": frames,
                    "height": height,
                    "width": width,
                    "latent_shape": None if lat is None else list(lat.shape),
                }
            )
            n_in_shard += 1
            if tar.offset >= cfg.target_shard_bytes:
                close_shard()
        if tar is not None:
            close_shard()
    finally:
        if tar is not None:
            tar.close()
        for p in tmpdir.iterdir():
            p.unlink()
        tmpdir.rmdir()

    samples = pd.DataFrame(sample_rows)
    samples["latent_shape"] = samples["latent_shape"].astype(object)
    index = DatasetIndex(
        root=str(out_url),
        shards=pd.DataFrame(shard_rows),
        samples=samples,
        embedding_dim=dim,
        meta={"writer": "vfm_core.data.shards", **(meta or {})},
    )
    write_index(index, format=index_format)
    return index


def _geometry(row, mp4: bytes, uri: str, probe, video_error) -> tuple[int, int, int]:
    """(frames, height, width) from the manifest, else from probing the clip."""
    try:
        vals = [int(row[c]) for c in ("n_frames", "height", "width")]
        if all(v > 0 for v in vals):
            return vals[0], vals[1], vals[2]
    except (KeyError, TypeError, ValueError):
        pass
    try:
        info = probe(io.BytesIO(mp4))
    except video_error as e:
        raise ShardError(uri, f"clip is not a usable video ({e.reason})") from None
    return info.n_frames, info.height, info.width
