"""The `Stage` protocol and `MapStage`, the base of every curation stage (user errors become
rejects), with the local copy of an input that the stages share.

A stage turns every user-caused failure (bad file, unreadable object, undecodable span, a path
that is no regular file such as a FIFO, a decode past `video.io.DECODE_TIMEOUT`) into a
`RejectRow` with its stage and reason; rejects from earlier stages pass through unchanged, so
every input ends as accepted clips or rejects, and every second of a probed video is in exactly
one clip or reject row (`vfm_core.curate.coverage`). A storage failure after the input was read
(e.g. uploading a clip) is not the input's fault: it raises, and the resumable run is retried.
Stages are plain picklable objects: the same instances run in-process or inside Ray actors.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import av

from vfm_core import storage
from vfm_core.curate.config import CurateConfig
from vfm_core.curate.records import (
    ClipTask,
    Item,
    ProbedVideo,
    RejectRow,
    SpanTask,
    SplitVideo,
    VideoRef,
)
from vfm_core.progress import MediaProgress
from vfm_core.video.container import VideoError

_USER_ERRORS = (VideoError, storage.StorageError, OSError, ValueError, av.FFmpegError)


@runtime_checkable
class Stage(Protocol):
    """One step of the pipeline: `setup()` once per worker, then `process(batch)` many times."""

    name: str

    def setup(self) -> None: ...

    def process(self, batch: list[Item]) -> list[Item]: ...


@dataclass(kw_only=True)
class MapStage:
    """A stage that maps each non-reject item to a list of items; user errors become rejects."""

    cfg: CurateConfig
    """Curation settings."""
    dst: str
    """Destination root (local path or s3:// URL)."""
    work_dir: str
    """Local scratch directory (downloads of s3:// inputs, clips before upload)."""
    name = "stage"
    reject_as = "probe"

    def setup(self) -> None:
        return None

    def process(self, batch: list[Item]) -> list[Item]:
        out: list[Item] = []
        for item in batch:
            if isinstance(item, RejectRow):
                out.append(item)
                continue
            try:
                out += self.one(item)
            except storage.StorageError as e:
                if self.name != "probe":
                    raise  # the store failed, not the input: fail the run (retry/resume)
                out.append(self._reject(item, e))
            except _USER_ERRORS as e:
                if getattr(e, "errno", None) in storage.DISK_FULL:  # the store, not the video: fail
                    # the run; the video gets no finished state and is curated on the next run
                    raise storage.StorageError(self.dst, f"disk full ({e})") from None
                out.append(self._reject(item, e))
        return out

    def one(self, item: Any) -> list[Item]:
        raise NotImplementedError

    def _reject(self, item: Any, e: BaseException) -> RejectRow:
        reason = e.reason if isinstance(e, VideoError | storage.StorageError) else str(e)
        reason = reason or type(e).__name__
        stage = "read" if isinstance(e, storage.StorageError) else self.reject_as
        if isinstance(item, VideoRef):  # the stated seconds when the header was read
            whole = e.duration_s if isinstance(e, VideoError) else None
            return RejectRow(
                source_uri=item.source_uri,
                stage=stage,
                reason=reason,
                start_s=None if whole is None else 0.0,
                end_s=whole,
            )
        video = item.video if isinstance(item, SplitVideo | SpanTask) else None
        span = item.span if isinstance(item, ClipTask) else None
        span = item if isinstance(item, SpanTask) else span
        video = span.video if span is not None else video if video is not None else item
        return RejectRow(
            source_uri=video.source_uri,
            video_id=video.video_id,
            stage=stage,
            reason=reason,
            start_s=span.start_s if span else 0.0,  # no span: the whole probed video
            end_s=span.end_s if span else video.duration_s,
            n_parts=span.n_parts if span else 1,
            video=video,
        )


def local_copy(url: str, work_dir: str) -> str:
    """A local path for `url`: the file itself, or a cached download of a remote object."""
    if not storage.is_remote(url):
        return url.removeprefix("file://")
    suffix = Path(url).suffix or ".bin"
    path = Path(work_dir) / "src" / (hashlib.sha256(url.encode()).hexdigest()[:20] + suffix)
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".part")
        try:
            with os.fdopen(fd, "wb") as out, storage.open_url(url, "rb") as f:
                while chunk := f.read(1 << 20):
                    out.write(chunk)
            os.replace(tmp, path)
        except BaseException as e:
            Path(tmp).unlink(missing_ok=True)
            if isinstance(e, OSError) and not isinstance(e, storage.StorageError):
                raise storage.StorageError(url, f"unreadable ({e})") from None
            raise
    return str(path)


def local_video(v: ProbedVideo, work_dir: str) -> str:
    """The video's local copy (re-fetched when this worker does not share the prober's disk)."""
    return v.local_path if os.path.exists(v.local_path) else local_copy(v.url, work_dir)


def video_progress(phase: str, v: ProbedVideo, start_s: float = 0.0) -> MediaProgress:
    """Lines on how far `phase` got through the video `v` (every ``$VFM_PROGRESS_EVERY_S`` s,
    none for a video done within that): a long video shows movement in the terminal and in a
    Prefect run's log (`vfm_core.progress`)."""
    name = v.source_uri.rstrip("/").rsplit("/", 1)[-1]
    return MediaProgress(v.duration_s, desc=f"{phase} {name}", start_s=start_s)
