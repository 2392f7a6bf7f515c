"""URLs for data on local disk or S3, through fsspec: open, list, atomic writes, content hashes.

Every stage takes and returns URLs (``/abs/path``, ``file:///abs/path`` or ``s3://bucket/key``),
so the same code runs on a laptop and against an object store. S3 goes through s3fs; its endpoint
comes from ``AWS_ENDPOINT_URL`` (or ``VFM_S3_ENDPOINT``) so tests can point it at a loopback
S3-protocol server.

Writes are atomic: a reader never sees half a manifest or half a shard (local: write to a temporary
sibling then ``os.replace``, the sibling removed when the write fails, e.g. on a full disk; S3: a
PUT is atomic by itself).
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import posixpath
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import fsspec

from vfm_core.errors import UserError

_CHUNK = 1 << 20


DISK_FULL = (errno.ENOSPC, errno.EDQUOT)
"""The errno of a write that met a full disk or quota: the store, not the input, failed."""


class StorageError(UserError, OSError):
    """A URL that cannot be read or written, with the URL and the reason."""

    def __init__(self, url: str, reason: str) -> None:
        super().__init__(f"{url}: {reason}")
        self.url = url
        self.reason = reason


def remote_failure(e: BaseException) -> str | None:
    """Why a remote store refused, when ``e`` is its client's error of access (botocore: no or
    partial credentials, an endpoint that does not answer), else None. By class name, so no
    client library is imported here."""
    names = {c.__name__ for c in type(e).__mro__}
    if names & {"NoCredentialsError", "PartialCredentialsError"}:
        return (
            "no S3 credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or AWS_PROFILE), "
            "and AWS_ENDPOINT_URL for an S3 server other than AWS"
        )
    if "EndpointConnectionError" in names:
        return f"the S3 endpoint does not answer ({e}); check AWS_ENDPOINT_URL"
    return None


class LocalFolderError(UserError, ValueError):
    """An output setting that does not name a local folder (:func:`local_folder`)."""


def local_folder(out: str | os.PathLike[str], setting: str, what: str) -> Path:
    """``out`` (named by ``setting``, e.g. ``--out``) checked as the local folder ``what`` is
    written to, before any work: not empty, not a URL, not a file or under one (it is created
    when written). A :class:`LocalFolderError` names the setting and the problem."""
    text = str(out)
    if not text.strip():
        raise LocalFolderError(f"{setting} is empty: name a local folder for {what}")
    if "://" in text:
        raise LocalFolderError(
            f"{setting} {text}: {what} is written to a local folder; copy it to the store "
            "afterwards"
        )
    path = Path(text)
    existing = next((q for q in (path, *path.parents) if q.exists()), None)
    if existing is not None and not existing.is_dir():
        where = "" if existing == path else f"{existing} "
        raise LocalFolderError(f"{setting} {text}: {where}is a file, not a folder")
    return path


def check_access(url: str) -> None:
    """Reach the store of a remote ``url`` once (before any work writes there): a client error
    of access is a :class:`StorageError` naming the URL (see :func:`remote_failure`)."""
    if not is_remote(url):
        return
    fs, path = filesystem(url)
    try:
        fs.exists(path)
    except Exception as e:
        reason = remote_failure(e)
        if reason is None:
            raise
        raise StorageError(str(url), reason) from None


_KINDS = (
    (stat.S_ISFIFO, "a named pipe (FIFO)"),
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def not_regular(path: str | os.PathLike[str]) -> str | None:
    """Why ``path`` (links followed) is no regular file, e.g. "a named pipe (FIFO)"; None for a
    regular file. Only ``stat``: the file is never opened (opening a FIFO blocks)."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return "file not found"
    except OSError as e:
        return f"cannot stat ({e.strerror or e})"
    if stat.S_ISREG(mode):
        return None
    return next((what for test, what in _KINDS if test(mode)), "not a regular file")


def is_remote(url: str) -> bool:
    return "://" in str(url) and not str(url).startswith("file://")


def storage_options(url: str) -> dict[str, Any]:
    """fsspec options for ``url``: the S3 endpoint from the environment, if any."""
    if str(url).startswith("s3://"):
        endpoint = os.environ.get("VFM_S3_ENDPOINT") or os.environ.get("AWS_ENDPOINT_URL")
        return {"client_kwargs": {"endpoint_url": endpoint}} if endpoint else {}
    return {}


def filesystem(url: str) -> tuple[fsspec.AbstractFileSystem, str]:
    """(filesystem, path inside it) for ``url``."""
    url = str(url)
    try:
        fs, path = fsspec.core.url_to_fs(url, **storage_options(url))
    except (ImportError, ValueError) as e:  # unknown protocol or s3fs missing
        raise StorageError(url, f"no filesystem for this URL ({e})") from None
    return fs, path


def join(url: str, *parts: str) -> str:
    """Join path parts onto a local path or URL with ``/``."""
    url = str(url)
    if is_remote(url):
        return posixpath.join(url.rstrip("/"), *parts)
    return str(Path(url.removeprefix("file://"), *parts))


def exists(url: str) -> bool:
    fs, path = filesystem(url)
    return fs.exists(path)


def open_url(url: str, mode: str = "rb") -> IO:
    """Open ``url`` (read modes only for remote files; use :func:`write_bytes` to write). A local
    path that is no regular file (a FIFO would block the read forever, a directory) is refused
    without opening it."""
    fs, path = filesystem(url)
    if "r" in mode and not is_remote(url):
        kind = not_regular(path)
        if kind not in (None, "file not found"):
            raise StorageError(str(url), f"not a regular file ({kind}): refused without opening it")
    try:
        return fs.open(path, mode)
    except FileNotFoundError:
        raise StorageError(str(url), "not found") from None
    except PermissionError as e:
        raise StorageError(str(url), f"permission denied ({e})") from None


def read_bytes(url: str) -> bytes:
    with open_url(url, "rb") as f:
        return f.read()


def write_bytes(url: str, data: bytes) -> str:
    """Write ``data`` to ``url`` atomically; create parent directories. Returns the URL."""
    url = str(url)
    fs, path = filesystem(url)
    if not is_remote(url):
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        tmp = f"{path}.tmp-{os.getpid()}"
        try:
            with open(tmp, "wb") as f:
                f.write(data)
            os.replace(tmp, path)
        except BaseException:  # a full disk (ENOSPC) or a kill: no half-written sibling left
            Path(tmp).unlink(missing_ok=True)
            raise
        return url
    with fs.open(path, "wb") as f:
        f.write(data)
    return url


def put_file(local: str | os.PathLike[str], url: str) -> str:
    """Copy a local file to ``url`` (atomically for local destinations)."""
    url = str(url)
    fs, path = filesystem(url)
    if not is_remote(url):
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        tmp = f"{path}.tmp-{os.getpid()}"
        try:
            with open(local, "rb") as src, open(tmp, "wb") as dst:
                while chunk := src.read(_CHUNK):
                    dst.write(chunk)
            os.replace(tmp, path)
        except BaseException:  # a full disk (ENOSPC): no half-written sibling left
            Path(tmp).unlink(missing_ok=True)
            raise
        return url
    fs.put_file(str(local), path)
    return url


def list_files(url: str, *, suffixes: tuple[str, ...] = ()) -> list[str]:
    """All files under ``url`` (recursive), sorted, as URLs of the same scheme; filtered by suffix
    (case-insensitive) when ``suffixes`` is given."""
    url = str(url)
    fs, path = filesystem(url)
    if not fs.exists(path):
        raise StorageError(url, "no such directory or prefix")
    if fs.isfile(path):
        found = [path]
    else:
        found = [p for p in fs.find(path) if not fs.isdir(p)]
    if suffixes:
        found = [p for p in found if p.lower().endswith(tuple(s.lower() for s in suffixes))]
    if not is_remote(url):
        return sorted(found)
    proto = url.split("://", 1)[0]
    return sorted(f"{proto}://{p}" for p in found)


def iter_chunks(url: str, chunk: int = _CHUNK) -> Iterator[bytes]:
    with open_url(url, "rb") as f:
        while data := f.read(chunk):
            yield data


def content_hash(url: str, *, length: int = 16) -> str:
    """sha256 of the bytes at ``url``, hex, truncated to ``length`` (the id of a video or shard)."""
    h = hashlib.sha256()
    for data in iter_chunks(url):
        h.update(data)
    return h.hexdigest()[:length]


def parquet_table(data: bytes):
    """A parquet file's bytes -> ``pyarrow.Table``, read on one thread: arrow's reader threads
    can outlive ``read_table`` on in-memory bytes and abort the interpreter at exit ("terminate
    called without an active exception", 1 run in 5 here; apache/arrow#33975). Raises
    ``pyarrow.ArrowException`` / ``OSError`` / ``ValueError`` for bytes that are not parquet."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    return pq.read_table(pa.BufferReader(data), use_threads=False)


def bytes_hash(data: bytes, *, length: int = 16) -> str:
    return hashlib.sha256(data).hexdigest()[:length]


def fingerprint(url: str) -> str:
    """Content fingerprint of a file or folder (what a cached pipeline stage reads), cheap
    enough for every run: a folder with an ``index.json`` (shards, latents) -> the sha256 of that
    index (written last, it carries every shard's sha256: rewriting the same samples keeps the
    fingerprint); any other folder or file (local or ``s3://``) -> its file listing with sizes
    and mtimes (ETags on S3); ``"missing"`` when there is nothing at ``url``."""
    fs, path = filesystem(url)
    if not fs.exists(path):
        return "missing"
    index = join(url, "index.json")
    if fs.isdir(path) and exists(index):
        return "index.json " + content_hash(index, length=64)
    listing = sorted(
        (
            name.removeprefix(path),
            info.get("size"),
            str(info.get("mtime", info.get("LastModified", ""))),
            str(info.get("ETag", "")),
        )
        for name, info in fs.find(path, detail=True).items()
    )
    return hashlib.sha256(json.dumps(listing).encode()).hexdigest()
