"""WebDataset-format shards: write from a clips manifest, read single samples by byte range.

A shard is a plain POSIX tar (``shard-000000.tar``) whose members are grouped by sample key, in
WebDataset naming: ``{key}.json`` (caption, source, span, sizes, scores), ``{key}.mp4`` (the clip;
an image is a one-frame clip), ``{key}.txt_emb.npy`` (caption embedding, float32 (L, D)) and
optionally ``{key}.latent.npy`` (pre-encoded latents, float32 (C, T, H, W)). Any WebDataset
reader can stream these tars. The writer also records each sample's byte range in the dataset
index (:mod:`vfm_core.data.index`), so the loader reads exactly the samples it needs (one range
request on S3) instead of streaming whole shards: the global sample order is then a free choice.

Reading is defensive: member names are checked (no ``..``, no absolute paths, no links, only the
known extensions of the expected key), ``.npy`` is loaded with ``allow_pickle=False`` and checked
for dtype, shape and NaN/inf; every problem raises :class:`SampleError` naming shard, key and
reason. Nothing in a shard is ever unpickled.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import tarfile
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from vfm_core import storage
from vfm_core.data.index import DatasetIndex, write_index

EXTENSIONS = ("json", "mp4", "txt_emb.npy", "latent.npy")
REQUIRED = ("json", "mp4", "txt_emb.npy")
KEY_RE = re.compile(r"^[A-Za-z0-9_-]+$")
MANIFEST_COLUMNS = ("clip_id", "uri", "caption")
_BLOCK = 512


class ShardError(ValueError):
    """A shard or sample that cannot be used; names the shard URL, the key and the reason."""

    def __init__(self, where: str, reason: str) -> None:
        super().__init__(f"{where}: {reason}")
        self.where, self.reason = where, reason


class SampleError(ShardError):
    """One bad sample (bad member, dtype, shape, NaN): the loader may skip it and count it."""


Embedder = Callable[[list[str]], np.ndarray]
"""Captions -> (N, D) float32 (or (N, L, D)) text embeddings."""


@dataclass(kw_only=True, slots=True)
class ShardWriterConfig:
    """How :func:`write_shards` cuts and fills shards."""

    target_shard_bytes: int = 64 << 20
    """Start a new shard once the current one reaches this size (a sample is never split)."""
    prefix: str = "shard"
    """Shard file names are ``{prefix}-{i:06d}.tar``."""
    embed_batch: int = 64
    """Captions per call of the text embedder."""


@dataclass(kw_only=True, slots=True)
class RawSample:
    """One decoded-from-tar sample (video still encoded)."""

    key: str
    meta: dict[str, Any]
    """The ``{key}.json`` document."""
    mp4: bytes
    txt_emb: np.ndarray
    """(L, D) float32 caption embedding."""
    latent: np.ndarray | None = None
    """(C, T, H, W) float32 latents, when the shard carries them."""
    nbytes: int = 0
    """Bytes of the sample's tar records."""
    extra: dict[str, bytes] = field(default_factory=dict)


# ------------------------------------------------------------------------------------------ writing
def _key(clip_id: Any) -> str:
    key = re.sub(r"[^A-Za-z0-9_-]", "_", str(clip_id))
    if not key:
        raise ShardError("manifest", f"clip_id {clip_id!r} gives an empty sample key")
    return key


def _npy_bytes(a: np.ndarray) -> bytes:
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
    if isinstance(v, float) and not np.isfinite(v):
        return None
    return v


def _sample_meta(row: dict[str, Any], frames: int, height: int, width: int) -> dict[str, Any]:
    meta = {k: _json_safe(v) for k, v in row.items() if k not in ("latent",)}
    meta.update(frames=frames, height=height, width=width, kind="image" if frames == 1 else "video")
    return meta


def _embed_all(captions: list[str], embed: Embedder, batch: int) -> list[np.ndarray]:
    out: list[np.ndarray] = []
    for i in range(0, len(captions), batch):
        e = np.asarray(embed(captions[i : i + batch]), dtype=np.float32)
        if e.ndim == 2:
            e = e[:, None, :]  # (N, 1, D): one pooled vector per caption
        if e.ndim != 3 or e.shape[0] != len(captions[i : i + batch]):
            raise ShardError("embedder", f"returned shape {e.shape}, expected (N, D) or (N, L, D)")
        out.extend(e)
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
) -> DatasetIndex:
    """Write ``clips`` (a clips manifest: ``clip_id, uri, caption`` + any metadata columns) as
    shards under ``out_url`` (local or ``s3://``) and the validated ``index.json``.

    ``uri`` may be relative to ``base_url``. ``latents`` maps clip_id -> (C, T, H, W) arrays to
    store as ``latent.npy``. Frame count and size come from the manifest (``n_frames``,
    ``height``, ``width``) or, when absent, from probing the clip.
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
    embs = _embed_all(captions, embed, cfg.embed_batch)
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
        digest = hashlib.sha256(tar_path.read_bytes()).hexdigest()
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
                (f"{key}.txt_emb.npy", _npy_bytes(emb)),
            ]
            lat = None if latents is None else latents.get(str(row["clip_id"]))
            if lat is not None:
                lat = np.asarray(lat, dtype=np.float32)
                if lat.ndim != 4 or not np.isfinite(lat).all():
                    raise ShardError(
                        f"clip {key}", f"latent must be finite (C, T, H, W), got shape {lat.shape}"
                    )
                members.append((f"{key}.latent.npy", _npy_bytes(lat)))
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
    write_index(index)
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


# ------------------------------------------------------------------------------------------ reading
def read_range(
    url: str, offset: int, length: int, *, retries: int = 3, backoff: float = 0.2
) -> bytes:
    """``length`` bytes of ``url`` from ``offset`` (one range request on S3), retried with
    exponential backoff on transient I/O errors; a short read (truncated shard) is an error."""
    fs, path = storage.filesystem(url)
    last: Exception | None = None
    for attempt in range(retries + 1):
        try:
            data = fs.cat_file(path, start=offset, end=offset + length)
            break
        except FileNotFoundError:
            raise ShardError(url, "shard not found") from None
        except _transient_errors() as e:
            last = e
            if attempt < retries:
                time.sleep(backoff * 2**attempt)
    else:
        raise ShardError(
            url,
            f"read of bytes {offset}..{offset + length} failed after {retries + 1} attempts "
            f"({type(last).__name__}: {last})",
        )
    if len(data) != length:
        raise ShardError(
            url, f"truncated: wanted bytes {offset}..{offset + length}, got {len(data)} bytes"
        )
    return data


def _transient_errors() -> tuple[type[BaseException], ...]:
    """I/O errors worth a retry: OS/network errors and botocore's (S3 through s3fs)."""
    errors: tuple[type[BaseException], ...] = (OSError, TimeoutError, ConnectionError)
    try:
        from botocore.exceptions import BotoCoreError

        errors += (BotoCoreError,)
    except ImportError:
        pass
    return errors


def _check_member(where: str, key: str, m: tarfile.TarInfo) -> str:
    name = m.name
    if name.startswith("/") or os.path.isabs(name) or ".." in name.split("/") or "/" in name:
        raise SampleError(where, f"unsafe member name {name!r} (absolute, '..' or a directory)")
    if not m.isreg():
        raise SampleError(where, f"member {name!r} is not a regular file (link or device)")
    if not name.startswith(key + "."):
        raise SampleError(where, f"member {name!r} does not belong to sample {key!r}")
    ext = name[len(key) + 1 :]
    if ext not in EXTENSIONS:
        raise SampleError(where, f"member {name!r} has an unknown extension {ext!r}")
    return ext


def load_npy(data: bytes, where: str, what: str) -> np.ndarray:
    """Parse ``.npy`` bytes without pickle; float32, finite."""
    try:
        a = np.load(io.BytesIO(data), allow_pickle=False)
    except ValueError as e:  # object arrays need pickle -> refused
        raise SampleError(where, f"{what} is not a plain numeric .npy ({e})") from None
    except (OSError, EOFError) as e:
        raise SampleError(where, f"{what} is not a readable .npy ({e})") from None
    if a.dtype != np.float32:
        raise SampleError(where, f"{what} has dtype {a.dtype}, expected float32")
    if not np.isfinite(a).all():
        raise SampleError(where, f"{what} contains NaN or inf")
    return a


def parse_sample(raw: bytes, key: str, *, embedding_dim: int, where: str = "") -> RawSample:
    """Parse one sample's tar records (as read by byte range) into a :class:`RawSample`."""
    where = f"{where} sample {key}".strip()
    members: dict[str, bytes] = {}
    try:
        with tarfile.open(fileobj=io.BytesIO(raw), mode="r:") as tar:
            for m in tar:
                ext = _check_member(where, key, m)
                f = tar.extractfile(m)
                assert f is not None
                members[ext] = f.read()
                if len(members[ext]) != m.size:
                    raise SampleError(where, f"member {m.name!r} is truncated")
    except tarfile.TarError as e:
        raise SampleError(where, f"corrupt tar records ({e})") from None
    lost = [e for e in REQUIRED if e not in members]
    if lost:
        raise SampleError(where, f"missing member(s) {', '.join(f'{key}.{e}' for e in lost)}")
    try:
        meta = json.loads(members["json"])
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise SampleError(where, f"{key}.json is not valid JSON ({e})") from None
    emb = load_npy(members["txt_emb.npy"], where, f"{key}.txt_emb.npy")
    if emb.ndim != 2 or emb.shape[1] != embedding_dim or emb.shape[0] < 1:
        raise SampleError(
            where, f"{key}.txt_emb.npy has shape {emb.shape}, expected (L, {embedding_dim})"
        )
    latent = None
    if "latent.npy" in members:
        latent = load_npy(members["latent.npy"], where, f"{key}.latent.npy")
        if latent.ndim != 4:
            raise SampleError(where, f"{key}.latent.npy has shape {latent.shape}, expected 4-D")
    return RawSample(
        key=key, meta=meta, mp4=members["mp4"], txt_emb=emb, latent=latent, nbytes=len(raw)
    )


def read_raw(index: DatasetIndex, i: int) -> bytes:
    """The tar records of sample ``i`` of ``index`` (one range read)."""
    row = index.samples.iloc[i]
    return read_range(index.shard_url(int(row["shard"])), int(row["offset"]), int(row["length"]))


def verify_shards(index: DatasetIndex, *, checksum: bool = True) -> None:
    """Check every shard's size (and sha256 when ``checksum``) against the index."""
    for i in range(len(index.shards)):
        url = index.shard_url(i)
        fs, path = storage.filesystem(url)
        try:
            size = fs.size(path)
        except FileNotFoundError:
            raise ShardError(url, "shard listed in the index is missing") from None
        want = int(index.shards.at[i, "bytes"])
        if size != want:
            raise ShardError(url, f"size {size} bytes, index says {want} (truncated or replaced)")
        if checksum:
            h = hashlib.sha256()
            for chunk in storage.iter_chunks(url):
                h.update(chunk)
            if h.hexdigest() != index.shards.at[i, "sha256"]:
                raise ShardError(url, "sha256 checksum does not match the index")


def iter_tar_keys(data: bytes) -> Iterable[str]:
    """Sample keys of a whole tar, in order (for tests and inspection)."""
    seen: list[str] = []
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tar:
        for m in tar:
            k = m.name.split(".", 1)[0]
            if not seen or seen[-1] != k:
                seen.append(k)
    return seen
