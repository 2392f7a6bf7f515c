"""Video I/O on PyAV: probe and decode at analysis size (encoding lives in `video.transcode`).

Every function takes a path or a binary file-like object (what `av.open` accepts), so an fsspec
file (`fsspec.open("s3://...").open()`) works as well as a local path. Every failure a user's file
can cause (empty, truncated, not a video, audio only, undecodable) raises `VideoError` with the
source and a one-line reason; callers turn it into a reject row.

Timestamps are seconds relative to the stream's first timestamp (`stream.start_time`), so a clip's
`start_s` / `end_s` mean the same thing in `probe`, `iter_frames` and `transcode.transcode_span`.

Two guards keep one bad input from stalling a run: a path that is not a regular file (a FIFO, a
device, a directory) is refused before it is opened (opening a FIFO blocks until a writer comes),
and every decode (`probe`, `iter_frames`, `decode_frames`, `count_frames`, the transcoder's decode
loop) runs under a wall-clock limit (`DECODE_TIMEOUT`, checked between packets) whose excess is a
`VideoError` like any other bad video.
"""

from __future__ import annotations

import os
import stat
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Literal

import av
import numpy as np

from vfm_core.errors import UserError

Source = str | os.PathLike[str] | IO[bytes]
"""A local path or a readable binary file object (seekable for MP4)."""

MAX_PIXELS = 8192 * 8192
"""Largest declared frame (width * height) probe accepts; bigger is rejected as a bogus header."""

_VFR_PACKETS = 64  # packets whose timestamps decide "variable frame rate"
_VFR_REORDER = 32  # extra packets read so the first _VFR_PACKETS in presentation order are all
# there: B-frames arrive after the later frame they reference (H.264 reorders at most 16 deep)
_VFR_TOLERANCE = 0.1  # relative spread of timestamp deltas still counted as constant rate


@dataclass(kw_only=True, slots=True, frozen=True)
class DecodeTimeout:
    """Wall-clock limit of one decode: ``base_s + per_media_s * seconds of media decoded``.

    Generous on purpose (a 4K stream on two busy cores decodes near real time, and the transcoder
    encodes inside the same loop): it bounds a pathological input, it does not pace good ones.
    Checked between demuxed packets, so it cannot interrupt one FFmpeg call that never returns."""

    base_s: float = 120.0
    """Fixed part (container open, first frames, seeking)."""
    per_media_s: float = 20.0
    """Seconds allowed per second of media in the decoded range."""
    unknown_media_s: float = 3600.0
    """Media length assumed when the container states none."""

    def seconds(self, media_s: float | None) -> float:
        media = media_s if media_s is not None and media_s > 0 else self.unknown_media_s
        return self.base_s + self.per_media_s * media


DECODE_TIMEOUT = DecodeTimeout()
"""The limit every decode of this module uses unless given ``timeout_s`` (read at call time)."""


class VideoError(UserError):
    """A video that cannot be used, with the source and a short reason (for reject manifests)."""

    def __init__(self, path: object, reason: str) -> None:
        self.path = str(path)
        self.reason = reason
        super().__init__(f"{self.path}: {reason}")


@dataclass(kw_only=True, slots=True, frozen=True)
class VideoInfo:
    """What `probe` learns about the first video stream of a container."""

    duration_s: float
    """Stream duration (container duration when the stream has none)."""
    fps: float
    """Average frame rate (frames / second)."""
    vfr: bool
    """True when the first packets' timestamp deltas are irregular (variable frame rate)."""
    width: int
    """Coded width in pixels (before rotation)."""
    height: int
    """Coded height in pixels (before rotation)."""
    codec: str
    """Decoder name, e.g. "h264"."""
    pix_fmt: str
    """Pixel format of decoded frames, e.g. "yuv420p", "yuv420p10le"."""
    rotation: int
    """Display rotation in degrees, counter-clockwise (0 when absent)."""
    n_frames: int
    """Frame count from the header, else estimated as round(duration_s * fps)."""
    has_video: bool
    """False for audio-only containers (only with `probe(..., require_video=False)`)."""


def _name(src: Source) -> str:
    if isinstance(src, (str, os.PathLike)):
        return os.fspath(src)
    return str(getattr(src, "name", None) or getattr(src, "path", None) or repr(src))


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


class _Deadline:
    """The wall-clock end of one decode (see `DecodeTimeout`)."""

    def __init__(self, name: str, timeout_s: float | None, media_s: float | None) -> None:
        self.name = name
        self.seconds = DECODE_TIMEOUT.seconds(media_s) if timeout_s is None else timeout_s
        self.end = time.monotonic() + self.seconds

    def check(self) -> None:
        if time.monotonic() > self.end:
            raise VideoError(
                self.name,
                f"decode exceeded its {self.seconds:.3g} s timeout (stalled or far too slow; "
                "vfm_core.video.io.DECODE_TIMEOUT)",
            )


def _media_seconds(c: av.container.InputContainer, s: av.VideoStream | None) -> float | None:
    """Duration the container states for stream ``s`` (or itself); None when it states none."""
    if s is not None and s.duration is not None and s.time_base is not None:
        return float(s.duration * s.time_base)
    if c.duration is not None:
        return float(c.duration / av.time_base)
    return None


def open_container(src: Source) -> av.container.InputContainer:
    """`av.open` for reading, with user-caused failures turned into `VideoError`; a path that is
    not a regular file (FIFO, device, directory) is refused without opening it."""
    name = _name(src)
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
        raise VideoError(name, f"not a readable media file ({_ffmpeg_reason(e)})") from e
    except (OSError, ValueError) as e:
        raise VideoError(name, f"unreadable ({e})") from e


def _ffmpeg_reason(e: BaseException) -> str:
    msg = getattr(e, "strerror", None) or str(e)
    return msg.split(":")[0].strip() if msg else type(e).__name__


def _video_stream(container: av.container.InputContainer, name: str) -> av.VideoStream:
    if not container.streams.video:
        kinds = sorted({s.type for s in container.streams}) or ["no streams"]
        raise VideoError(name, f"no video stream ({', '.join(kinds)} only)")
    return container.streams.video[0]


def _t0(stream: av.VideoStream) -> int:
    return stream.start_time if stream.start_time is not None else 0


def probe(
    src: Source,
    *,
    require_video: bool = True,
    max_pixels: int = MAX_PIXELS,
    timeout_s: float | None = None,
) -> VideoInfo:
    """Read the header, the first packets' timestamps and the first frame of the first video stream.

    Decoding one frame proves the stream is decodable and yields the rotation and pixel format.
    Raises `VideoError` for empty / truncated / non-media / audio-only (unless `require_video` is
    False) / undecodable inputs, for declared sizes above `max_pixels` and when it takes longer
    than `timeout_s` (default: `DECODE_TIMEOUT`).
    """
    name = _name(src)
    began = time.monotonic()
    with open_container(src) as c:
        if not c.streams.video:
            if require_video:
                _video_stream(c, name)
            dur = float(c.duration / av.time_base) if c.duration else 0.0
            return VideoInfo(
                duration_s=dur,
                fps=0.0,
                vfr=False,
                width=0,
                height=0,
                codec="",
                pix_fmt="",
                rotation=0,
                n_frames=0,
                has_video=False,
            )
        s = c.streams.video[0]
        w, h = s.codec_context.width, s.codec_context.height
        if w <= 0 or h <= 0:
            raise VideoError(name, f"invalid frame size {w}x{h}")
        if w * h > max_pixels:
            raise VideoError(name, f"declared frame size {w}x{h} exceeds {max_pixels} pixels")
        _check_complete(src, s, name)
        tb = s.time_base
        # timestamps of the first packets (in decode order) -> variable frame rate flag
        pts: list[int] = []
        first: av.VideoFrame | None = None
        deadline = _Deadline(name, timeout_s, _media_seconds(c, s))
        deadline.end -= time.monotonic() - began  # the open counts too
        try:
            for packet in c.demux(s):
                deadline.check()
                if packet.pts is not None and len(pts) < _VFR_PACKETS + _VFR_REORDER:
                    pts.append(packet.pts)
                if first is None:
                    for frame in packet.decode():
                        first = frame
                        break
                if first is not None and len(pts) >= _VFR_PACKETS + _VFR_REORDER:
                    break
        except av.FFmpegError as e:
            if first is None:
                raise VideoError(name, f"undecodable video stream ({_ffmpeg_reason(e)})") from e
        if first is None:
            raise VideoError(name, "video stream has no decodable frame (truncated or empty)")
        vfr = _is_vfr(pts)
        if s.duration is not None and tb is not None:
            duration = float(s.duration * tb)
        elif c.duration is not None:
            duration = float(c.duration / av.time_base)
        else:
            duration = 0.0
        rate = s.average_rate or s.guessed_rate or s.base_rate
        fps = float(rate) if rate else (len(pts) / duration if duration > 0 else 0.0)
        n_frames = int(s.frames) if s.frames else int(round(duration * fps))
        return VideoInfo(
            duration_s=duration,
            fps=fps,
            vfr=vfr,
            width=w,
            height=h,
            codec=s.codec_context.name,
            pix_fmt=first.format.name,
            rotation=int(round(first.rotation or 0)) % 360,
            n_frames=max(n_frames, 1),
            has_video=True,
        )


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


def _check_complete(src: Source, stream: av.VideoStream, name: str) -> None:
    """Raise if the sample index (MP4/MOV/MKV) points past the end of the file (truncated)."""
    try:
        entries = stream.index_entries
        n = len(entries)
    except (AttributeError, av.FFmpegError):
        return
    if n == 0:
        return
    last = entries[n - 1]
    size = _source_size(src)
    if size is not None and last.pos > 0 and last.pos + last.size > size:
        raise VideoError(
            name, f"truncated: sample index needs {last.pos + last.size} bytes, file has {size}"
        )


def _is_vfr(pts: list[int], *, reorder: int = _VFR_REORDER) -> bool:
    """Irregular presentation-time deltas among the first packets.

    `pts` are in decode order; with B-frames that is not presentation order (I0 P3 B1 B2 ...), so
    the deltas are taken after sorting. The last `reorder` packets read may have been decoded
    ahead of frames not read yet (P3 before B1, B2): only the earliest ``len(pts) - reorder``
    presentation times are used, otherwise a constant-rate stream shows a false gap at the end.
    A short stream (fewer packets than that) was read whole and is used whole.
    """
    if len(pts) < 4:
        return False
    p = np.sort(np.asarray(pts, dtype=np.int64))
    if len(pts) >= _VFR_PACKETS + reorder:
        p = p[: len(pts) - reorder]
    d = np.diff(p)
    d = d[d > 0]
    if d.size < 3:
        return False
    med = float(np.median(d))
    return bool(np.max(np.abs(d - med)) > _VFR_TOLERANCE * med)


SKIP_LOOP_FILTER: dict[str, str] = {"skip_loop_filter": "all"}
"""Decoder options of the fast analysis decode (the shot splitter's default): no in-loop
deblocking (H.264 / HEVC; codecs without the option ignore it). Deblocking smooths 4x4 / 8x8
block edges, which a 64 px colour histogram cannot see, but it is ~15-30% of decoding a deblocked
720p H.264 stream (x264 presets other than ultrafast, camera and web video). Reference frames
then stay unfiltered, so the error drifts until the next keyframe: a few grey levels at block
edges, not a colour change (benchmarks/curation.py measures the split's F1 with and without it).
Never for pictures that are kept (transcode, captions, filter scores)."""


def analysis_size(width: int, height: int, target_width: int | None) -> tuple[int, int]:
    """(w, h) scaled to `target_width` keeping aspect, both even and >= 2; identity for None."""
    if target_width is None or target_width >= width:
        return width, height
    h = max(2, int(round(height * target_width / width / 2)) * 2)
    return max(2, target_width - target_width % 2), h


def iter_frames(
    src: Source,
    *,
    width: int | None = None,
    height: int | None = None,
    start_s: float | None = None,
    end_s: float | None = None,
    threads: str = "AUTO",
    interpolation: str = "FAST_BILINEAR",
    resize: Literal["swscale", "sample"] = "swscale",
    decoder_options: Mapping[str, str] | None = None,
    timeout_s: float | None = None,
) -> Iterator[tuple[float, np.ndarray]]:
    """Yield (time_s, RGB uint8 (H, W, 3)) for the frames with start_s <= t < end_s.

    `width` alone keeps the aspect ratio (analysis size, e.g. 64); the scale to that size happens
    inside FFmpeg's swscale (`frame.to_ndarray(width=..., height=...)`), not in numpy. Decoding uses
    FFmpeg's frame/slice threads (`thread_type=threads`). `resize="sample"` instead reads the
    decoded YUV planes in place and point-samples them on the output grid (2x2 luma average), then
    converts the small picture to RGB through per-code tables: ~0.25 ms CPU per 720p frame on top
    of decoding vs ~0.7 ms for swscale to 64 px, measured in the decode loop (8-bit 4:2:0 /
    4:4:4 only; other formats fall back to swscale). `decoder_options` are FFmpeg decoder
    options (AVOptions) set before the decoder opens, e.g. `SKIP_LOOP_FILTER` for analysis. With
    `start_s`, the demuxer seeks to the previous keyframe and the frames before `start_s` are
    decoded and skipped. The whole iteration (the caller's work between frames included) runs
    under `timeout_s` (default: `DECODE_TIMEOUT` for the range's length); past it, `VideoError`.
    """
    name = _name(src)
    size: tuple[int, int] | None = None
    sampler: _PlaneSampler | None = None
    frames = _iter_av_frames(
        src,
        start_s=start_s,
        end_s=end_s,
        threads=threads,
        name=name,
        options=decoder_options,
        timeout_s=timeout_s,
    )
    for t, frame in frames:
        if size is None:  # the output size from the first frame's coded size (no second open)
            if height is None:
                size = analysis_size(frame.width, frame.height, width)
            else:
                size = (width or frame.width, height)
        w, h = size
        if resize == "sample" and frame.format.name in _SAMPLED_FORMATS:
            if sampler is None:
                sampler = _PlaneSampler(frame.width, frame.height, w, h)
            yield t, sampler(frame)
        else:
            # scale + convert inside swscale: (h, w, 3) uint8
            yield (
                t,
                frame.to_ndarray(format="rgb24", width=w, height=h, interpolation=interpolation),
            )


_SAMPLED_FORMATS = {"yuv420p": 2, "yuvj420p": 2, "yuv444p": 1, "yuvj444p": 1}


def _yuv_luts(full_range: bool) -> tuple[np.ndarray, ...]:
    """BT.601 terms per 8-bit code as float32: (y', 1.402 v', 0.344136 u', 0.714136 v', 1.772 u').

    Each entry is the exact float32 the per-pixel formula computes for that code, so gathering
    them and adding in the formula's order gives bit-identical RGB at a fraction of the work.
    """
    a = np.arange(256, dtype=np.float32)
    c = a - 128.0
    if full_range:
        y = a
    else:
        y = (a - 16.0) * (255.0 / 219.0)
        c = c * (255.0 / 224.0)
    return y, 1.402 * c, 0.344136 * c, 0.714136 * c, 1.772 * c


class _PlaneSampler:
    """Point-sample Y/U/V planes of a frame on a (h, w) grid and convert to RGB (BT.601).

    Luma is the rounded mean of the 2x2 pixels at each grid point, chroma the co-sited sample.
    Reads go straight into the decoder's plane buffers through flat gather indices (cached per
    line size), never copying a full frame; RGB comes from per-code float32 tables.
    """

    def __init__(self, src_w: int, src_h: int, w: int, h: int) -> None:
        self.ys = ((np.arange(h) + 0.5) * src_h / h).astype(np.intp).clip(0, src_h - 2)
        self.xs = ((np.arange(w) + 0.5) * src_w / w).astype(np.intp).clip(0, src_w - 2)
        self.w, self.h = w, h
        self._index: dict[tuple[int, int, int], tuple[np.ndarray, ...]] = {}
        self._luts = {full: _yuv_luts(full) for full in (False, True)}

    def _indices(self, sub: int, ls: int, cls: int) -> tuple[np.ndarray, ...]:
        key = (sub, ls, cls)
        if key not in self._index:
            i00 = (self.ys[:, None] * ls + self.xs[None, :]).ravel()  # (h*w,) top-left luma
            ic = ((self.ys // sub)[:, None] * cls + (self.xs // sub)[None, :]).ravel()  # (h*w,)
            self._index[key] = (i00, i00 + 1, i00 + ls, i00 + ls + 1, ic)
        return self._index[key]

    def __call__(self, frame: av.VideoFrame) -> np.ndarray:
        name = frame.format.name
        p0, p1, p2 = frame.planes[:3]
        i00, i01, i10, i11, ic = self._indices(_SAMPLED_FORMATS[name], p0.line_size, p1.line_size)
        lum = np.frombuffer(p0, np.uint8)
        y = (lum[i00].astype(np.uint16) + lum[i01] + lum[i10] + lum[i11] + 2) >> 2  # (h*w,)
        u = np.frombuffer(p1, np.uint8)[ic]  # (h*w,)
        v = np.frombuffer(p2, np.uint8)[ic]  # (h*w,)
        ly, rv, gu, gv, bu = self._luts[name.startswith("yuvj")]
        yf = ly[y]
        rgb = np.empty((self.h * self.w, 3), np.float32)  # (h*w, 3)
        np.add(yf, rv[v], out=rgb[:, 0])
        np.subtract(yf, gu[u], out=rgb[:, 1])
        rgb[:, 1] -= gv[v]
        np.add(yf, bu[u], out=rgb[:, 2])
        rgb += 0.5
        np.clip(rgb, 0, 255, out=rgb)
        return rgb.astype(np.uint8).reshape(self.h, self.w, 3)  # (h, w, 3)


def decode_frames(
    src: Source,
    *,
    width: int | None = None,
    height: int | None = None,
    start_s: float | None = None,
    end_s: float | None = None,
    threads: str = "AUTO",
    resize: Literal["swscale", "sample"] = "swscale",
    timeout_s: float | None = None,
) -> np.ndarray:
    """All frames of [start_s, end_s) as RGB uint8 (T, H, W, 3); see `iter_frames`."""
    it = iter_frames(
        src,
        width=width,
        height=height,
        start_s=start_s,
        end_s=end_s,
        threads=threads,
        resize=resize,
        timeout_s=timeout_s,
    )
    frames = [a for _, a in it]
    if not frames:
        raise VideoError(_name(src), "no frames in the requested range")
    return np.stack(frames)  # (T, H, W, 3)


def _iter_av_frames(
    src: Source,
    *,
    start_s: float | None,
    end_s: float | None,
    threads: str,
    name: str | None = None,
    options: Mapping[str, str] | None = None,
    timeout_s: float | None = None,
) -> Iterator[tuple[float, av.VideoFrame]]:
    """(time_s, av.VideoFrame) with start_s <= t < end_s (by frame centre), after a keyframe seek.

    `options`: FFmpeg decoder options, applied before the decoder opens (at the first packet).

    A decode error after the first frame ends the iteration quietly (damaged tail: the caller
    sees fewer frames than probed); before it, it raises `VideoError`. So does running past
    `timeout_s` (default: `DECODE_TIMEOUT` for the range's length), checked at every packet.
    """
    name = name or _name(src)
    began = time.monotonic()
    with open_container(src) as c:
        s = _video_stream(c, name)
        media = _media_seconds(c, s)  # seconds of media in [start_s, end_s)
        if end_s is not None:
            media = (end_s if media is None else min(media, end_s)) - (start_s or 0.0)
        elif media is not None and start_s:
            media -= start_s
        deadline = _Deadline(name, timeout_s, media)
        deadline.end -= time.monotonic() - began  # the open counts too
        s.codec_context.thread_type = threads
        if options:
            s.codec_context.options = dict(options)
        tb, t0 = s.time_base, _t0(s)
        rate = s.average_rate or s.guessed_rate
        half = 0.5 / float(rate) if rate else 0.0  # a frame belongs to [start, end) by its centre
        if start_s:
            c.seek(t0 + int(start_s / tb), stream=s, backward=True, any_frame=False)
        n_out = 0
        try:
            for frame in _decode(c, s, deadline):
                if frame.pts is None:
                    continue
                t = float((frame.pts - t0) * tb)
                if start_s is not None and t < start_s - half:
                    continue
                if end_s is not None and t >= end_s - half:
                    break
                n_out += 1
                yield t, frame
        except av.FFmpegError as e:
            if n_out == 0:
                raise VideoError(name, f"decode failed ({_ffmpeg_reason(e)})") from e


def _decode(
    c: av.container.InputContainer, s: av.VideoStream, deadline: _Deadline
) -> Iterator[av.VideoFrame]:
    """`c.decode(s)` (demux, decode, flush at the end) with the deadline checked per packet."""
    for packet in c.demux(s):
        deadline.check()
        yield from packet.decode()


@dataclass(kw_only=True, slots=True, frozen=True)
class FrameCount:
    """What `count_frames` found."""

    decoded: int
    """Frames that decode (no pixel conversion)."""
    declared: int
    """Frame count the container states (MP4 sample table); 0 when it states none."""


def count_frames(src: Source, *, timeout_s: float | None = None) -> FrameCount:
    """Decode every frame of the first video stream (a test decode: no conversion, nothing kept).

    Raises `VideoError` when no frame decodes or the decode runs past `timeout_s`; a clip that
    decodes to fewer frames than it declares is damaged (flipped or lost bytes)."""
    name = _name(src)
    n = 0
    for _ in _iter_av_frames(src, start_s=None, end_s=None, threads="AUTO", timeout_s=timeout_s):
        n += 1
    if n == 0:
        raise VideoError(name, "video stream has no decodable frame")
    with open_container(src) as c:
        declared = int(_video_stream(c, name).frames or 0)
    return FrameCount(decoded=n, declared=declared)
