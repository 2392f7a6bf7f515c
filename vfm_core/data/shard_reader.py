"""Reading shards safely: one sample by byte range, parsed and checked, never unpickled.

Member names are checked (no ``..``, no absolute paths, no links, only the known extensions of the
expected key); ``.npy`` is loaded with ``allow_pickle=False`` and checked for dtype, shape and
NaN/inf; byte-range reads are retried with backoff on transient I/O errors (S3 outages) and a short
read (truncated shard) is an error. Every problem names the shard, the key and the reason.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import tarfile
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from vfm_core import storage
from vfm_core.data.index import DatasetIndex

EXTENSIONS = ("json", "mp4", "txt_emb.npy", "latent.npy", "tokens.npy")
"""tokens.npy: int32 (T, h, w) ids of a discrete tokenizer, written beside its codes in
latent.npy (for other readers; vfm reads the codes)."""
REQUIRED = ("json", "mp4", "txt_emb.npy")


class ShardError(ValueError):
    """A shard or sample that cannot be used; names the shard URL, the key and the reason."""

    def __init__(self, where: str, reason: str) -> None:
        super().__init__(f"{where}: {reason}")
        self.where, self.reason = where, reason


class SampleError(ShardError):
    """One bad sample (bad member, dtype, shape, NaN): the loader may skip it and count it."""


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
    if a.dtype == np.float16 and what.endswith("txt_emb.npy"):
        a = a.astype(np.float32)  # caption embeddings are stored in half precision
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
