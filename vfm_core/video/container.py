"""Opening a video source: the `Source` type, `VideoError`, `open_container` and the checks made
before anything is decoded (shared by `video.io` and `video.transcode`).

Every failure a user's file can cause (empty, truncated, not a video, audio only, undecodable)
raises `VideoError` with the source and a one-line reason (and the duration the container
states, when it was read that far); callers turn it into a reject row. A path that is not a
regular file (a FIFO, a device, a directory) is refused before it is opened (opening a FIFO blocks
until a writer comes), and a sample index (MP4/MOV/MKV) that points past the end of the file is a
truncated file (`truncation`): its decodable prefix may still be used (`io.probe(...,
allow_truncated=True)`).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import IO

import av

from vfm_core.errors import UserError
from vfm_core.storage import not_regular

Source = str | os.PathLike[str] | IO[bytes]
"""A local path or a readable binary file object (seekable for MP4)."""


class VideoError(UserError):
    """A video that cannot be used, with the source and a short reason (for reject manifests)
    and `duration_s`, the seconds its container states (None when unknown: a reject row of the
    whole input then has no times)."""

    def __init__(self, path: object, reason: str, *, duration_s: float | None = None) -> None:
        self.path = str(path)
        self.reason = reason
        self.duration_s = duration_s if duration_s is not None and duration_s > 0 else None
        super().__init__(f"{self.path}: {reason}")


def source_name(src: Source) -> str:
    if isinstance(src, (str, os.PathLike)):
        return os.fspath(src)
    return str(getattr(src, "name", None) or getattr(src, "path", None) or repr(src))


def open_container(src: Source) -> av.container.InputContainer:
    """`av.open` for reading, with user-caused failures turned into `VideoError`; a path that is
    not a regular file (FIFO, device, directory) is refused without opening it."""
    name = source_name(src)
    if isinstance(src, (str, os.PathLike)):
        p = Path(src)
        if not p.exists():
            raise VideoError(name, "file not found")
        kind = not_regular(p)
        if kind is not None:
            raise VideoError(name, f"not a regular file ({kind}): refused without opening it")
        if p.stat().st_size == 0:
            raise VideoError(name, "empty file (0 bytes)")
    elif hasattr(src, "seek"):
        src.seek(0)  # file objects are read from the start on every open
    try:
        return av.open(src if not isinstance(src, os.PathLike) else os.fspath(src), mode="r")
    except av.FFmpegError as e:
        unfinished = _mp4_without_index(src) if isinstance(src, (str, os.PathLike)) else None
        if unfinished is not None:
            raise VideoError(name, unfinished) from e
        raise VideoError(name, f"not a readable media file ({ffmpeg_reason(e)})") from e
    except (OSError, ValueError) as e:
        raise VideoError(name, f"unreadable ({e})") from e


def _mp4_without_index(path: str | os.PathLike[str]) -> str | None:
    """Why an MP4 / MOV that FFmpeg cannot open is unreadable when its media data is there but
    its index is not (the top-level boxes hold an `mdat` and no `moov`: a recording that stopped
    before the camera or app finalised it); None for anything else."""
    boxes: list[bytes] = []
    mdat = 0
    with open(path, "rb") as f:
        size_all = os.fstat(f.fileno()).st_size
        pos = 0
        while pos + 8 <= size_all and len(boxes) < 1000:
            f.seek(pos)
            head = f.read(16)
            size, kind = int.from_bytes(head[:4], "big"), head[4:8]
            if size == 1 and len(head) == 16:
                size = int.from_bytes(head[8:16], "big")
            elif size == 0:
                size = size_all - pos
            if size < 8 or not kind.isalnum():
                break
            boxes.append(kind)
            mdat += min(size, size_all - pos) if kind == b"mdat" else 0  # what the file holds
            pos += size
    if not boxes or boxes[0] != b"ftyp" or b"moov" in boxes or not mdat:
        return None
    return (
        f"MP4 without its index (no moov box): the recording stopped before it was finalised; "
        f"its {mdat / 1e6:.1f} MB of media data need a repair tool and a reference file from "
        "the same camera (e.g. untrunc)"
    )


def ffmpeg_reason(e: BaseException) -> str:
    msg = getattr(e, "strerror", None) or str(e)
    return msg.split(":")[0].strip() if msg else type(e).__name__


def moving_streams(container: av.container.InputContainer) -> list[av.VideoStream]:
    """The container's video streams that are moving pictures: not a cover picture (a song's
    or a film's artwork, one still image stored as a video stream marked ``attached_pic``)."""
    still = av.stream.Disposition.attached_pic
    return [s for s in container.streams.video if not s.disposition & still]


def video_stream(container: av.container.InputContainer, name: str) -> av.VideoStream:
    """The first moving-picture stream (`moving_streams`); `VideoError` naming what the
    container holds instead."""
    moving = moving_streams(container)
    if not moving:
        kinds = sorted({s.type for s in container.streams if s.type != "video"})
        if container.streams.video:  # cover pictures only
            kinds.append("a cover picture")
        raise VideoError(
            name, f"no video stream ({' and '.join(kinds)} only)" if kinds else "no streams"
        )
    return moving[0]


def stream_t0(stream: av.VideoStream) -> int:
    return stream.start_time if stream.start_time is not None else 0


def media_seconds(c: av.container.InputContainer, s: av.VideoStream | None) -> float | None:
    """Duration the container states for stream ``s`` (or itself); None when it states none."""
    if s is not None and s.duration is not None and s.time_base is not None:
        return float(s.duration * s.time_base)
    if c.duration is not None:
        return float(c.duration / av.time_base)
    return None


def _source_size(src: Source) -> int | None:
    if isinstance(src, (str, os.PathLike)):
        return Path(src).stat().st_size
    size = getattr(src, "size", None)
    if isinstance(size, int):
        return size
    try:
        pos = src.tell()
        end = src.seek(0, os.SEEK_END)
        src.seek(pos)
        return int(end)
    except (OSError, AttributeError, ValueError):
        return None


def truncation(src: Source, stream: av.VideoStream) -> str | None:
    """Why the file is truncated: its sample index (MP4/MOV/MKV) points past the end of the file
    ("truncated: sample index needs N bytes, file has M"); None when it does not, or has none."""
    try:
        entries = stream.index_entries
        n = len(entries)
    except (AttributeError, av.FFmpegError):
        return None
    if n == 0:
        return None
    last = entries[n - 1]
    size = _source_size(src)
    if size is not None and last.pos > 0 and last.pos + last.size > size:
        return f"truncated: sample index needs {last.pos + last.size} bytes, file has {size}"
    return None
