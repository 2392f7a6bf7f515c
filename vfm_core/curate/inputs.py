"""The inputs of a curation run: every video under SRC (a folder, an ``s3://`` prefix or one
file) by suffix, the files passed over named in one warning, and the destination made absolute."""

from __future__ import annotations

import logging
import posixpath
from collections import Counter
from pathlib import Path

from vfm_core import storage
from vfm_core.curate.records import VideoRef

log = logging.getLogger(__name__)

VIDEO_SUFFIXES = (".mp4", ".mov", ".mkv", ".webm", ".avi", ".m4v", ".mpg", ".mpeg", ".ts")
"""Files with these suffixes (case-insensitive) are curation inputs."""
SIDECAR_SUFFIXES = (".json", ".txt")
"""Files beside the videos that are not inputs themselves (a video's caption sidecar)."""


def discover_videos(src: str) -> list[VideoRef]:
    """:func:`discover`, none found a :class:`~vfm_core.storage.StorageError` naming ``src``."""
    refs = discover(src)
    if not refs:
        raise storage.StorageError(
            str(src), "no video files found (suffixes: " + ", ".join(VIDEO_SUFFIXES) + ")"
        )
    return refs


def discover(src: str, *, suffixes: tuple[str, ...] = VIDEO_SUFFIXES) -> list[VideoRef]:
    """Input videos under `src` (a directory, an s3:// prefix, or one file), sorted.

    `source_uri` is each file as given under SRC (`src` joined with its relative path); `url` is
    where to read it (absolute local path or the s3:// URL). Nothing is opened here: an entry that
    is not a regular file (a FIFO named ``x.mp4``) is listed like any other and the probe stage
    rejects it, unopened, with the reason.
    """
    src = str(src)
    fs, root = storage.filesystem(src)
    if fs.exists(root) and not fs.isdir(root):  # one file (or one FIFO, device: rejected later)
        url = src if storage.is_remote(src) else str(Path(root).resolve())
        return [VideoRef(source_uri=src, url=url)]
    refs, others = [], Counter()
    wanted = tuple(x.lower() for x in suffixes)
    for url in storage.list_files(src):
        if not url.lower().endswith(wanted):
            ext = posixpath.splitext(url)[1].lower() or "(none)"
            if ext not in SIDECAR_SUFFIXES:  # caption sidecars belong to a video
                others[ext] += 1
            continue
        _, path = storage.filesystem(url)
        rel = path[len(root.rstrip("/")) :].lstrip("/")
        refs.append(VideoRef(source_uri=storage.join(src, rel), url=url))
    if others:  # nothing under SRC is passed over without a word
        log.warning(
            "%s: %d file(s) without a video suffix are not curated (%s; curated: %s)",
            src,
            others.total(),
            ", ".join(f"{ext} {n}" for ext, n in sorted(others.items())),
            " ".join(suffixes),
        )
    return refs


def resolve_dst(dst: str) -> str:
    """Local destinations become absolute, so clip uris are readable from any cwd."""
    if storage.is_remote(str(dst)):
        return str(dst)
    return str(Path(str(dst).removeprefix("file://")).resolve())


def check_paths(src: str, dst: str) -> str:
    """``dst`` made absolute (:func:`resolve_dst`) after the checks a run needs before any work:
    neither is empty, a remote one names a bucket and its store answers, a local DST is a
    directory or can be made one, and DST is neither SRC nor under it (the next run over SRC
    would curate its own clips as new videos), nor the folder of a SRC that is one video."""
    for name, value in (("SRC", src), ("DST", dst)):
        if not str(value).strip():
            raise ValueError(f"curate: {name} is empty (give a folder or an s3:// prefix)")
    out = resolve_dst(dst)
    if not storage.is_remote(out):
        first = next(a for a in (Path(out), *Path(out).parents) if a.exists())
        if not first.is_dir():
            what = "is a file" if first == Path(out) else f"cannot be made: {first} is a file"
            raise storage.StorageError(str(dst), f"DST {what}, not a directory")
    for name, value in (("SRC", src), ("DST", dst)):
        if storage.is_remote(value):
            if not str(value).split("://", 1)[1].strip("/"):
                raise ValueError(f"curate: {name} {value} names no bucket (s3://BUCKET/PREFIX)")
            storage.check_access(value)  # a store without credentials: one line, now
    inside = resolve_dst(src)
    if not storage.is_remote(inside) and Path(inside).is_file():  # one video
        if out == str(Path(inside).parent):  # its clips among the raw videos of that folder
            raise ValueError(
                f"curate: DST {dst} holds SRC {src}: the clips would land among the raw videos "
                "(a run over that folder would curate them as new videos); choose another DST"
            )
    if out == inside or out.startswith(inside.rstrip("/") + "/"):
        where = "is SRC" if out == inside else f"is inside SRC {src}"
        raise ValueError(
            f"curate: DST {dst} {where}: a later run over SRC would curate its own clips as new "
            "videos; choose a DST outside SRC"
        )
    return out
