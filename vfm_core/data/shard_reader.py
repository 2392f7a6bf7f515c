"""Reading shards safely: one sample by byte range, parsed and checked, never unpickled.

A sample's tar records are checked against the per-sample checksum of the index first
(:func:`sample_checksum`, written with the shard or when a foreign tar is indexed): flipped bytes
in any member (a clip that would decode to garbage, a caption embedding that is still finite) fail
it and the sample is skipped, named. Member names are checked (no ``..``, no absolute paths, no
links, only the known extensions of the expected key); ``.npy`` is loaded with
``allow_pickle=False`` and checked for dtype, shape and NaN/inf; byte-range reads are retried with
backoff on transient I/O errors (S3 outages) and a short read (truncated shard) is an error.
Every problem names the shard, the key and the reason.

A foreign WebDataset indexed by ``vfm index`` (:mod:`vfm_core.data.foreign_index`) has two byte
ranges per sample: the foreign tar's members of the sample (``{member_key}.mp4|webm|jpg|png``,
``.txt``, ``.json``, ... as written by ``webdataset.TarWriter``) and, in a sidecar tar, the
caption embedding ``{key}.txt_emb.npy`` with ``{key}.vfm.json`` (caption, geometry, origin).
:func:`read_raw` reads both ranges and concatenates them (still a valid run of tar records);
:func:`parse_indexed` parses them with the sample's ``member_key`` and ``media`` extension (the
clip or image, handed out as ``RawSample.mp4``: PyAV decodes images as one-frame clips).
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import tarfile
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from vfm_core import storage
from vfm_core.data.index_tables import DatasetIndex
from vfm_core.errors import UserError
from vfm_core.progress import Progress

EXTENSIONS = ("json", "mp4", "txt_emb.npy", "latent.npy", "tokens.npy")
"""tokens.npy: int32 (T, h, w) ids of a discrete tokenizer, written beside its codes in
latent.npy (for other readers; vfm reads the codes)."""
REQUIRED = ("json", "mp4", "txt_emb.npy")
SIDECAR_EXTENSIONS = ("txt_emb.npy", "vfm.json")
"""Members of a foreign sample's sidecar range (named with the index key)."""


CHECKSUM_DIGITS = 32
"""Hex digits of a per-sample checksum: the first 128 bits of the sha256 of the sample's tar
records (what :func:`read_raw` returns), plenty to tell corrupt bytes from good ones."""


def sample_checksum(raw: bytes) -> str:
    """The per-sample checksum of the index: sha256 of the sample's tar records, 32 hex digits
    (~1.8 GB/s here, negligible next to decoding the clip)."""
    return hashlib.sha256(raw).hexdigest()[:CHECKSUM_DIGITS]


class ShardError(UserError, ValueError):
    """A shard or sample that cannot be used; names the shard URL, the key and the reason."""

    def __init__(self, where: str, reason: str) -> None:
        super().__init__(f"{where}: {reason}")
        self.where, self.reason = where, reason


def check_directory(url: str, what: str) -> None:
    """A local ``url`` (``what``: e.g. ``SHARDS_DIR``) that exists but is no directory is a
    :class:`ShardError` naming it (a ``.tar`` file: pass its directory); a missing path or a
    remote prefix passes (the caller reads or creates it). Only ``stat``: nothing is opened."""
    if storage.is_remote(url):
        return
    kind = storage.not_regular(url)
    if kind in ("a directory", "file not found"):
        return
    hint = ""
    if kind is None and str(url).endswith(".tar"):
        hint = f"; to use this shard pass its directory, {os.path.dirname(os.path.abspath(url))}"
    raise ShardError(str(url), f"{what} is not a directory but {kind or 'a file'}{hint}")


def relative_files(dir_url: str) -> list[str]:
    """The files under ``dir_url`` (recursive, sorted) as paths relative to it."""
    _, root = storage.filesystem(dir_url)
    cut = len(root.rstrip("/")) + 1
    return [f.split("://", 1)[-1][cut:] for f in storage.list_files(dir_url)]


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
    """Foreign samples: their other members by extension (``txt``, ``cls``, ...)."""


def read_range(
    url: str, offset: int, length: int, *, retries: int = 5, backoff: float = 0.5
) -> bytes:
    """``length`` bytes of ``url`` from ``offset`` (one range request on S3), retried with
    exponential backoff on transient I/O errors (default: waits of 0.5 .. 8 s, ~15 s in all, on
    top of the S3 client's own retries: an endpoint restart is waited out); a short read
    (truncated shard) is an error."""
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


def _check_foreign_member(where: str, key: str, member_key: str, m: tarfile.TarInfo) -> str:
    """Extension of a foreign sample's member (``member_key.EXT``, lower case, as webdataset
    reads it) or of its sidecar member (``key.txt_emb.npy`` / ``key.vfm.json``)."""
    name = m.name
    if name.startswith("/") or os.path.isabs(name) or ".." in name.split("/"):
        raise SampleError(where, f"unsafe member name {name!r} (absolute or '..')")
    if not m.isreg():
        raise SampleError(where, f"member {name!r} is not a regular file (link or device)")
    for prefix in (member_key, key):
        rest = name[len(prefix) + 1 :] if name.startswith(prefix + ".") else ""
        if rest and "/" not in rest and (prefix == member_key or rest in SIDECAR_EXTENSIONS):
            return rest.lower()
    raise SampleError(where, f"member {name!r} does not belong to sample {member_key!r}")


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


def parse_sample(
    raw: bytes,
    key: str,
    *,
    embedding_dim: int,
    where: str = "",
    member_key: str | None = None,
    media: str | None = None,
) -> RawSample:
    """Parse one sample's tar records (as read by byte range) into a :class:`RawSample`.

    ``media`` (foreign samples, see the module docstring): the extension of the member holding
    the clip or image; ``member_key``: the sample's key in the foreign tar (default ``key``)."""
    where = f"{where} sample {key}".strip()
    if media is not None:
        return _parse_foreign(raw, key, member_key or key, media, embedding_dim, where)
    members = _read_members(raw, where, lambda m: _check_member(where, key, m))
    lost = [e for e in REQUIRED if e not in members]
    if lost:
        raise SampleError(where, f"missing member(s) {', '.join(f'{key}.{e}' for e in lost)}")
    meta = _json_member(members["json"], f"{key}.json", where)
    emb = _caption_embedding(members["txt_emb.npy"], key, embedding_dim, where)
    latent = None
    if "latent.npy" in members:
        latent = load_npy(members["latent.npy"], where, f"{key}.latent.npy")
        if latent.ndim != 4:
            raise SampleError(where, f"{key}.latent.npy has shape {latent.shape}, expected 4-D")
    return RawSample(
        key=key, meta=meta, mp4=members["mp4"], txt_emb=emb, latent=latent, nbytes=len(raw)
    )


def _read_members(
    raw: bytes, where: str, check: Callable[[tarfile.TarInfo], str]
) -> dict[str, bytes]:
    """Members of a run of tar records by extension (``check(TarInfo) -> ext`` vets each)."""
    members: dict[str, bytes] = {}
    try:
        with tarfile.open(fileobj=io.BytesIO(raw), mode="r:") as tar:
            for m in tar:
                ext = check(m)
                f = tar.extractfile(m)
                assert f is not None
                members[ext] = f.read()
                if len(members[ext]) != m.size:
                    raise SampleError(where, f"member {m.name!r} is truncated")
    except tarfile.TarError as e:
        raise SampleError(where, f"corrupt tar records ({e})") from None
    return members


def _caption_embedding(data: bytes, key: str, embedding_dim: int, where: str) -> np.ndarray:
    emb = load_npy(data, where, f"{key}.txt_emb.npy")
    if emb.ndim != 2 or emb.shape[1] != embedding_dim or emb.shape[0] < 1:
        raise SampleError(
            where, f"{key}.txt_emb.npy has shape {emb.shape}, expected (L, {embedding_dim})"
        )
    return emb


def _json_member(data: bytes, name: str, where: str) -> Any:
    try:
        return json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise SampleError(where, f"{name} is not valid JSON ({e})") from None


def _parse_foreign(
    raw: bytes, key: str, member_key: str, media: str, embedding_dim: int, where: str
) -> RawSample:
    """A foreign sample: its own members + the sidecar's ``txt_emb.npy`` / ``vfm.json``. Meta is
    the foreign ``json`` member (an object; anything else lands under ``"json"``) updated with
    ``vfm.json``; the other members go to ``extra``."""
    members = _read_members(raw, where, lambda m: _check_foreign_member(where, key, member_key, m))
    need = {media: member_key, "txt_emb.npy": key}
    lost = [f"{k}.{e}" for e, k in need.items() if e not in members]
    if lost:
        raise SampleError(where, f"missing member(s) {', '.join(lost)}")
    meta: dict[str, Any] = {}
    if "json" in members:
        doc = _json_member(members["json"], f"{member_key}.json", where)
        meta.update(doc if isinstance(doc, dict) else {"json": doc})
    if "vfm.json" in members:
        meta.update(_json_member(members["vfm.json"], f"{key}.vfm.json", where))
    emb = _caption_embedding(members["txt_emb.npy"], key, embedding_dim, where)
    skip = {media, "json", *SIDECAR_EXTENSIONS}
    extra = {e: v for e, v in members.items() if e not in skip}
    return RawSample(
        key=key, meta=meta, mp4=members[media], txt_emb=emb, nbytes=len(raw), extra=extra
    )


def check_sample(raw: bytes, want: str | None, *, where: str, key: str) -> None:
    """Raise :class:`SampleError` naming ``where`` (the shard) and ``key`` when the tar records
    ``raw`` do not have the index's checksum ``want`` (None: the index has none, no check)."""
    if want is None or not isinstance(want, str):
        return
    if sample_checksum(raw) != want:
        raise SampleError(
            f"{where} sample {key}".strip(),
            "checksum mismatch: its bytes are not those indexed (corrupt or replaced shard)",
        )


def parse_indexed(index: DatasetIndex, i: int, raw: bytes, *, where: str = "") -> RawSample:
    """:func:`parse_sample` for sample ``i`` of ``index`` (foreign samples: with its
    ``member_key`` and ``media``)."""
    row = index.row(i)
    key, dim = str(row["key"]), index.embedding_dim
    if not index.foreign:
        return parse_sample(raw, key, embedding_dim=dim, where=where)
    return parse_sample(
        raw,
        key,
        embedding_dim=dim,
        where=where,
        member_key=str(row["member_key"]),
        media=str(row["media"]),
    )


def read_raw(index: DatasetIndex, i: int) -> bytes:
    """The tar records of sample ``i`` of ``index`` (one range read; a foreign sample's sidecar
    range, its caption embedding, is a second read appended to the first)."""
    row = index.row(i)
    raw = read_range(index.shard_url(int(row["shard"])), int(row["offset"]), int(row["length"]))
    if not index.foreign:
        return raw
    side = index.sidecar_url(int(row["emb_shard"]))
    return raw + read_range(side, int(row["emb_offset"]), int(row["emb_length"]))


def verify_shards(index: DatasetIndex, *, checksum: bool = True) -> None:
    """Check every shard's (and sidecar's) size, and sha256 when ``checksum``, against the
    index."""
    tables = [(index.shards, index.shard_url, "shard")]
    if index.sidecars is not None:
        tables.append((index.sidecars, index.sidecar_url, "sidecar"))
    files = sum(len(t) for t, _, _ in tables)
    log = logging.getLogger(__name__)
    bar = Progress(files, desc="verifying shards", unit="file", delay_s=2.0, logger=log)
    for table, url_of, what in tables:
        for i in range(len(table)):
            url = url_of(i)
            fs, path = storage.filesystem(url)
            try:
                size = fs.size(path)
            except FileNotFoundError:
                raise ShardError(url, f"{what} listed in the index is missing") from None
            want = int(table.at[i, "bytes"])
            if size != want:
                raise ShardError(
                    url, f"size {size} bytes, index says {want} (truncated or replaced)"
                )
            if checksum:
                h = hashlib.sha256()
                for chunk in storage.iter_chunks(url):
                    h.update(chunk)
                if h.hexdigest() != table.at[i, "sha256"]:
                    raise ShardError(url, "sha256 checksum does not match the index")
            bar.update()
    bar.close()


def iter_tar_keys(data: bytes) -> Iterable[str]:
    """Sample keys of a whole tar, in order (for tests and inspection)."""
    seen: list[str] = []
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tar:
        for m in tar:
            k = m.name.split(".", 1)[0]
            if not seen or seen[-1] != k:
                seen.append(k)
    return seen
