"""Video I/O on PyAV: probe and decode at analysis size (encoding lives in `video.transcode`).

Every function takes a path or a binary file-like object (what `av.open` accepts), so an fsspec
file (`fsspec.open("s3://...").open()`) works as well as a local path. Every failure a user's file
can cause raises `VideoError` (opening a source and its checks live in `video.container`);
callers turn it into a reject row.

Timestamps are seconds relative to the stream's first timestamp (`stream.start_time`), so a clip's
`start_s` / `end_s` mean the same thing in `probe`, `iter_frames` and `transcode.transcode_span`.

Two guards keep one bad input from stalling a run: a path that is not a regular file is refused
before it is opened (`video.container.open_container`), and every decode (`probe`, `iter_frames`,
`decode_frames`, `count_frames`, the transcoder's decode loop) runs under a wall-clock limit
(`DECODE_TIMEOUT`, checked between packets) whose excess is a `VideoError` like any other bad
video.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Literal

import av
import numpy as np

from vfm_core.video.container import (
    Source,
    VideoError,
    ffmpeg_reason,
    media_seconds,
    moving_streams,
    open_container,
    source_name,
    stream_t0,
    truncation,
    video_stream,
)
from vfm_core.video.convert import FrameConverter
from vfm_core.video.plane_sampler import SAMPLED_FORMATS, PlaneSampler

log = logging.getLogger(__name__)

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


def probe(
    src: Source,
    *,
    require_video: bool = True,
    max_pixels: int = MAX_PIXELS,
    timeout_s: float | None = None,
    allow_truncated: bool = False,
) -> VideoInfo:
    """Read the header, the first packets' timestamps and the first frame of the first video stream.

    Decoding one frame proves the stream is decodable and yields the rotation and pixel format.
    Raises `VideoError` for empty / truncated / non-media / audio-only (unless `require_video` is
    False) / undecodable inputs, for declared sizes above `max_pixels` and when it takes longer
    than `timeout_s` (default: `DECODE_TIMEOUT`). With `allow_truncated`, a truncated file (its
    sample index points past its end: `container.truncation`) whose first frame decodes is
    probed like a whole one (its stated duration and frame count; decoding ends early, see
    `lost_tail`). Once the header is read, the error carries the stated duration (`duration_s`).
    """
    name = source_name(src)
    began = time.monotonic()
    with open_container(src) as c:
        if not moving_streams(c):  # no stream, or only a cover picture
            if require_video:
                video_stream(c, name)
            return _no_video_info(c)
        s = video_stream(c, name)
        w, h = s.codec_context.width, s.codec_context.height
        if w <= 0 or h <= 0:
            raise VideoError(name, f"invalid frame size {w}x{h}")
        if w * h > max_pixels:
            raise VideoError(name, f"declared frame size {w}x{h} exceeds {max_pixels} pixels")
        stated = media_seconds(c, s)
        cut = truncation(src, s)
        if cut is not None and not allow_truncated:
            raise VideoError(name, cut, duration_s=stated)
        deadline = _Deadline(name, timeout_s, stated)
        deadline.end -= time.monotonic() - began  # the open counts too
        try:
            first, pts = _first_frame_and_pts(c, s, deadline, name)
        except VideoError as e:  # nothing decodes: every stated second is lost
            why = e.reason if cut is None else f"{cut}: no frame decodes"
            raise VideoError(name, why, duration_s=stated) from e
        vfr = _is_vfr(pts)
        duration = _duration_s(c, s)
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


def _no_video_info(c: av.container.InputContainer) -> VideoInfo:
    """The :class:`VideoInfo` of a container without a video stream (its duration only)."""
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


def _first_frame_and_pts(
    c: av.container.InputContainer, s: av.VideoStream, deadline: _Deadline, name: str
) -> tuple[av.VideoFrame, list[int]]:
    """The first decoded frame of stream ``s`` and the timestamps of its first packets (in
    decode order: the variable frame rate flag's input); VideoError when no frame decodes."""
    pts: list[int] = []
    first: av.VideoFrame | None = None
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
            raise VideoError(name, f"undecodable video stream ({ffmpeg_reason(e)})") from e
    if first is None:
        raise VideoError(name, "video stream has no decodable frame (truncated or empty)")
    return first, pts


def _duration_s(c: av.container.InputContainer, s: av.VideoStream) -> float:
    """Seconds of stream ``s`` as declared (by the stream, else the container; 0: unknown)."""
    if s.duration is not None and s.time_base is not None:
        return float(s.duration * s.time_base)
    if c.duration is not None:
        return float(c.duration / av.time_base)
    return 0.0


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
    every: int = 1,
) -> Iterator[tuple[float, np.ndarray]]:
    """Yield (time_s, RGB uint8 (H, W, 3)) for the frames with start_s <= t < end_s (with
    `every`: only the 0th, every-th, 2*every-th... of them; the others are decoded, not converted).

    `width` alone keeps the aspect ratio (analysis size, e.g. 64); the scale to that size happens
    inside FFmpeg's swscale (one context reused per conversion: `video.convert.FrameConverter`), not
    in numpy. Decoding uses FFmpeg's frame/slice threads (`thread_type=threads`). `resize="sample"`
    instead reads the decoded YUV planes in place and point-samples them on the output grid (2x2
    luma average), then converts the small picture to RGB through per-code tables: ~0.25 ms CPU per
    720p frame on top of decoding vs ~0.7 ms for swscale to 64 px, measured in the decode loop
    (8-bit 4:2:0 / 4:4:4 only; other formats fall back to swscale). `decoder_options` are FFmpeg
    decoder options (AVOptions) set before the decoder opens, e.g. `SKIP_LOOP_FILTER` for analysis.
    With `start_s`, the demuxer seeks to the previous keyframe and the frames before `start_s` are
    decoded and skipped. The whole iteration (the caller's work between frames included) runs under
    `timeout_s` (default: `DECODE_TIMEOUT` for the range's length); past it, `VideoError`.
    """
    name = source_name(src)
    size: tuple[int, int] | None = None
    sampler: PlaneSampler | None = None
    converter = FrameConverter()  # swscale contexts reused across the clip's frames
    frames = iter_av_frames(
        src,
        start_s=start_s,
        end_s=end_s,
        threads=threads,
        name=name,
        options=decoder_options,
        timeout_s=timeout_s,
    )
    for i, (t, frame) in enumerate(frames):
        if i % every:
            continue
        if size is None:  # the output size from the first frame's coded size (no second open)
            if height is None:
                size = analysis_size(frame.width, frame.height, width)
            else:
                size = (width or frame.width, height)
        w, h = size
        if resize == "sample" and frame.format.name in SAMPLED_FORMATS:
            if sampler is None or sampler.src != (frame.width, frame.height):  # (size change)
                sampler = PlaneSampler(frame.width, frame.height, w, h)
            yield t, sampler(frame)
        else:
            yield t, _swscale_rgb(converter, frame, size, interpolation)


def _swscale_rgb(
    converter: FrameConverter, frame: av.VideoFrame, size: tuple[int, int], interpolation: str
) -> np.ndarray:
    """(h, w, 3) uint8 RGB of `frame` at `size` (w, h), scaled and converted inside swscale."""
    w, h = size
    rgb = converter.convert(frame, format="rgb24", width=w, height=h, interpolation=interpolation)
    return rgb.to_ndarray()


def iter_sampled_chunks(
    src: Source,
    *,
    width: int | None,
    chunk: int,
    threads: str = "AUTO",
    decoder_options: Mapping[str, str] | None = None,
    timeout_s: float | None = None,
) -> Iterator[tuple[np.ndarray, list[float]]]:
    """``iter_frames(src, width=width, resize="sample", ...)`` in chunks: (RGB uint8 frames
    (B, h, w, 3), their times), B = `chunk` but for the last (or where the pixel format
    changes). The same frames bit for bit; the per-frame work is only the reads on the sample
    grid, the RGB conversion is one numpy pass a chunk (~2x less CPU on a 64 px analysis
    frame, where per-call overhead dominates)."""
    name = source_name(src)
    sampler: PlaneSampler | None = None
    converter = FrameConverter()
    size: tuple[int, int] | None = None
    codes: list[tuple[np.ndarray, ...]] = []
    rgbs: list[np.ndarray] = []
    ts: list[float] = []
    kind: str | None = None  # the chunk's frames: "yuv" / "yuvj" codes, or "rgb" via swscale

    def flush() -> tuple[np.ndarray, list[float]]:
        nonlocal codes, rgbs, ts
        if codes:
            y4, u, v = (np.stack(c) for c in zip(*codes, strict=True))  # (B, h*w) each
            out = sampler.rgb(y4, u, v, full=kind == "yuvj")  # (B, h, w, 3)
        else:
            out = np.stack(rgbs)
        got = (out, ts)
        codes, rgbs, ts = [], [], []
        return got

    frames = iter_av_frames(
        src,
        start_s=None,
        end_s=None,
        threads=threads,
        name=name,
        options=decoder_options,
        timeout_s=timeout_s,
    )
    for t, frame in frames:
        if size is None:
            size = analysis_size(frame.width, frame.height, width)
        fmt = frame.format.name
        this = ("yuvj" if fmt.startswith("yuvj") else "yuv") if fmt in SAMPLED_FORMATS else "rgb"
        if ts and this != kind:
            yield flush()
        kind = this
        if this == "rgb":
            rgbs.append(_swscale_rgb(converter, frame, size, "FAST_BILINEAR"))
        else:
            if sampler is None or sampler.src != (frame.width, frame.height):  # (size change)
                sampler = PlaneSampler(frame.width, frame.height, *size)
            codes.append(sampler.codes(frame))
        ts.append(t)
        if len(ts) == chunk:
            yield flush()
    if ts:
        yield flush()


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
    every: int = 1,
) -> np.ndarray:
    """All frames of [start_s, end_s) as RGB uint8 (T, H, W, 3), or every `every`-th of them
    (``frames[::every]``, converting only those); see `iter_frames`."""
    it = iter_frames(
        src,
        width=width,
        height=height,
        start_s=start_s,
        end_s=end_s,
        threads=threads,
        resize=resize,
        timeout_s=timeout_s,
        every=every,
    )
    frames = [a for _, a in it]
    if not frames:
        raise VideoError(source_name(src), "no frames in the requested range")
    return np.stack(frames)  # (T, H, W, 3)


ONE_THREAD_PIXELS = 256 * 256
"""Pictures up to this size are decoded (`iter_av_frames` with threads "AUTO") and encoded
(`transcode.x264_threads`) on one thread: FFmpeg's frame threads cost more than they win there.
Decode, ms a frame (wall / CPU) on 2 cores, automatic threads against one: 160x90 0.077 / 0.107
against 0.065 / 0.065; 176x144 0.34 / 0.46 against 0.40 / 0.40 (1.2x the wall, 0.87x the CPU:
curation keeps both cores busy with other work); 640x272 0.36 / 0.52 against 0.44 / 0.44.
libx264 veryfast: 160x90 0.28 on one thread against 0.39 on x264's automatic count, 320x136
0.74 / 1.01; 480x204 1.53 / 1.26, 1280x720 9.3 / 6.6."""


def decoder_threads(threads: str, width: int, height: int) -> str:
    """The decoder's thread type for `threads` on a (width, height) picture: "AUTO" becomes
    "NONE" (one thread) up to `ONE_THREAD_PIXELS`; anything else is kept."""
    return "NONE" if threads == "AUTO" and width * height <= ONE_THREAD_PIXELS else threads


_OBSERVER: ContextVar[Callable[[float], None] | None] = ContextVar(
    "vfm_decode_observer", default=None
)
"""What `observe_decode` installed: called with the time of every frame `iter_av_frames` yields."""


@dataclass(kw_only=True, slots=True, frozen=True)
class DecodeGap:
    """A break inside a stream that no clip may cross, found while decoding: seconds whose
    frames did not decode, with more decoding after them (the decoder failed on a packet,
    damaged bytes, and the frames up to the next keyframe, which need that one, were skipped),
    the rest of a stream whose timestamps start again (recordings joined end to end: the
    decode stops there), or, with no seconds lost (`start_s == end_s`), a change of the coded
    picture size (a recording that switched resolution). `iter_av_frames` reports them to
    `collect_gaps`."""

    frame: int
    """Index, among the frames the decode yielded, of the first frame after the gap."""
    start_s: float
    """End of the last frame before the gap (the range's start when none)."""
    end_s: float
    """Time of the first frame after it."""
    reason: str
    """Why, as a reject row says it: "damaged: no frame decodes from 8.30 to 8.70 s (Invalid
    data found when processing input)", "timestamps start again at 0.07 s after 6.03 s ...",
    or "picture size changes from 320x240 to 640x360"."""


_GAPS: ContextVar[list[DecodeGap] | None] = ContextVar("vfm_decode_gaps", default=None)


@contextmanager
def collect_gaps() -> Iterator[list[DecodeGap]]:
    """Within the block, every gap a decode of this module skips over (in this thread or task)
    is appended to the list this yields (`DecodeGap`); outside such a block gaps are skipped
    silently (their frames are simply missing)."""
    gaps: list[DecodeGap] = []
    token = _GAPS.set(gaps)
    try:
        yield gaps
    finally:
        _GAPS.reset(token)


@contextmanager
def observe_decode(callback: Callable[[float], None]) -> Iterator[None]:
    """Within the block, every frame a decode of this module yields (in this thread or task)
    reports its time in seconds to `callback` first, e.g. the progress of a long video
    (`vfm_core.progress.MediaProgress.at`). The callback must be cheap: it runs per frame."""
    token = _OBSERVER.set(callback)
    try:
        yield
    finally:
        _OBSERVER.reset(token)


def iter_av_frames(
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

    A packet the decoder fails on (damaged bytes) is skipped with the packets up to the next
    keyframe, whose frames need it; decoding goes on from there and the skipped seconds are a
    `DecodeGap` (reported to `collect_gaps`); so are a change of the picture size (a gap of no
    seconds) and timestamps that start again (recordings joined end to end: the iteration ends
    there, the gap holds the rest's seconds). A read error after the first frame ends the
    iteration quietly (damaged tail: the caller sees fewer frames than probed); an error before
    any frame decodes raises `VideoError`. So does running past `timeout_s` (default:
    `DECODE_TIMEOUT` for the range's length), checked at every packet.
    """
    name = name or source_name(src)
    began = time.monotonic()
    observe, gaps = _OBSERVER.get(), _GAPS.get()
    skips = _Skips()

    with open_container(src) as c:
        s = video_stream(c, name)
        media = media_seconds(c, s)  # seconds of media in [start_s, end_s)
        if end_s is not None:
            media = (end_s if media is None else min(media, end_s)) - (start_s or 0.0)
        elif media is not None and start_s:
            media -= start_s
        deadline = _Deadline(name, timeout_s, media)
        deadline.end -= time.monotonic() - began  # the open counts too
        cc = s.codec_context
        cc.thread_type = decoder_threads(threads, cc.width, cc.height)
        if options:
            s.codec_context.options = dict(options)
        tb, t0 = s.time_base, stream_t0(s)
        # a frame's time (pts - t0) * tb as one int division: the correctly rounded float of the
        # exact fraction, as float(Fraction) gives, without a Fraction per frame
        num, den = (tb.numerator, tb.denominator) if tb is not None else (None, None)
        rate = s.average_rate or s.guessed_rate
        half = 0.5 / float(rate) if rate else 0.0  # a frame belongs to [start, end) by its centre
        n_out, after = 0, start_s or 0.0  # frames yielded; the end of the last one
        size: tuple[int, int] | None = None  # the coded picture size of the last one
        try:
            frames = (
                _decode_from(c, s, deadline, start_s=start_s, half=half, skips=skips)
                if start_s
                else _decode(c, s, deadline, skips=skips)
            )
            for frame in frames:
                if frame.pts is None:
                    continue
                t = (frame.pts - t0) * num / den
                if skips.resumed_by(frame):  # the first frame after skipped packets
                    if gaps is not None and t > after + half and t >= (start_s or 0.0):
                        why = f"damaged: no frame decodes from {after:.2f} to {t:.2f} s"
                        why += f" ({skips.reason})"
                        gaps.append(DecodeGap(frame=n_out, start_s=after, end_s=t, reason=why))
                    skips.clear()
                if n_out and t < after - 1.0:  # timestamps start again: the rest is not read
                    if gaps is not None:
                        gaps.append(_restart(c, s, frame, n_out, after=after, half=half))
                    return
                if start_s is not None and t < start_s - half:
                    continue
                if end_s is not None and t >= end_s - half:
                    break
                if size != (frame.width, frame.height):
                    if gaps is not None and size is not None:
                        why = f"picture size changes from {size[0]}x{size[1]} to "
                        why += f"{frame.width}x{frame.height}"
                        gaps.append(DecodeGap(frame=n_out, start_s=t, end_s=t, reason=why))
                    size = (frame.width, frame.height)
                n_out += 1
                after = t + 2 * half
                if observe is not None:
                    observe(t)
                yield t, frame
        except av.FFmpegError as e:
            if n_out == 0:
                raise VideoError(name, f"decode failed ({ffmpeg_reason(e)})") from e
        if n_out == 0 and skips.reason is not None:
            raise VideoError(name, f"decode failed ({skips.reason})")


def _restart(
    c: av.container.InputContainer,
    s: av.VideoStream,
    frame: av.VideoFrame,
    k: int,
    *,
    after: float,
    half: float,
) -> DecodeGap:
    """The break where a stream's timestamps start again (`frame`, the `k`-th frame, is earlier
    than the end of the one before, `after`): recordings joined end to end (``cat a.ts b.ts``),
    whose timeline is ambiguous from there (a seek by time finds the first part). The rest's
    seconds, summed part by part from the packets still to come (demuxed, not decoded), are one
    range after `after`, so they are accounted for."""
    tb = s.time_base
    lo = hi = frame.pts
    total, parts = 0, 1
    for p in c.demux(s):
        ts = p.pts if p.pts is not None else p.dts
        if ts is None:
            continue
        if ts < hi - 1 / tb:  # another restart
            total, lo, hi, parts = total + hi - lo, ts, ts, parts + 1
        lo, hi = min(lo, ts), max(hi, ts)
    rest = float((total + hi - lo) * tb) + parts * 2 * half
    t = float((frame.pts - stream_t0(s)) * tb)
    why = (
        f"timestamps start again at {t:.2f} s after {after:.2f} s (recordings joined end to "
        f"end?): the {rest:.2f} s from there are not curated; remux the parts with continuous "
        "timestamps first (e.g. ffmpeg -f concat)"
    )
    return DecodeGap(frame=k, start_s=after, end_s=after + rest, reason=why)


@dataclass(kw_only=True, slots=True)
class _Skips:
    """Decoder errors `_decode` skipped over since the last gap `iter_av_frames` reported."""

    reason: str | None = None
    """The first error's reason."""
    resume_pts: int | None = None
    """Timestamp of the keyframe the decoding went on from (None: not yet)."""

    def failed(self, e: av.FFmpegError) -> None:
        if self.reason is None:
            self.reason = ffmpeg_reason(e)

    def resume(self, packet: av.Packet) -> None:
        pts = packet.pts if packet.pts is not None else packet.dts
        self.resume_pts = -(2**62) if pts is None else pts

    def resumed_by(self, frame: av.VideoFrame) -> bool:
        """`frame` is the resume keyframe's or later (frames decoded before the error come out
        of the decoder's reorder buffer first)."""
        return self.resume_pts is not None and frame.pts >= self.resume_pts

    def clear(self) -> None:
        self.reason = self.resume_pts = None


SEEK_BACK_S = (0.0, 1.0, 4.0, 16.0)
"""How far before a range's start `_decode_from` seeks, try after try, before it decodes from the
container's start."""


def _decode_from(
    c: av.container.InputContainer,
    s: av.VideoStream,
    deadline: _Deadline,
    *,
    start_s: float,
    half: float,
    skips: _Skips | None = None,
) -> Iterator[av.VideoFrame]:
    """Decoded frames from a seek to the keyframe before video-clock second `start_s`: from the
    first keyframe decoded, which must be at or before the range's first frame (`half`: half a
    frame). MP4 and MKV seek to that keyframe; MPEG-TS (camcorder .mts / .m2ts, broadcast)
    seeks by timestamp, so it may land inside a group of pictures: the decoder drops its frames
    up to the next keyframe (the range would lose its first frames) or rebuilds them from
    missing references (wrong pictures). When the first keyframe decoded is past the range's
    start, the seek is tried again further back (`SEEK_BACK_S`), at last from the container's
    start. Frames shown before that keyframe (an open GOP's leading pictures, whose references
    precede the seek) are before the range: they are dropped. `skips`: as `_decode`'s."""
    tb, t0 = s.time_base, stream_t0(s)
    for back in (*SEEK_BACK_S, None):
        target = None if back is None else start_s - back
        last_try = target is None or target <= 0
        if last_try:  # the container's time 0: before every stream
            c.seek(0, backward=True, any_frame=False)  # (a TS seek to t0 can land after it)
            yield from _decode(c, s, deadline, skips=skips)
            return
        c.seek(t0 + int(target / tb), stream=s, backward=True, any_frame=False)
        frames = _decode(c, s, deadline, skips=skips)
        for f in frames:
            if f.pts is None:
                continue
            t = float((f.pts - t0) * tb)
            if f.key_frame and t < start_s + half:  # a clean start at or before the range
                yield f
                yield from frames
                return
            if t >= start_s + half:  # the range began before the first keyframe decoded
                log.debug("seek to %.3f s landed at %.3f s: seeking further back", start_s, t)
                break


def _decode(
    c: av.container.InputContainer,
    s: av.VideoStream,
    deadline: _Deadline,
    *,
    skips: _Skips | None = None,
) -> Iterator[av.VideoFrame]:
    """`c.decode(s)` (demux, decode, flush at the end) with the deadline checked per packet.

    `skips`: None raises the decoder's first error; else the error is noted there and the
    packets after the failed one are skipped up to the next keyframe (their frames reference
    what did not decode), whose timestamp is noted too."""
    skipping = False
    for packet in c.demux(s):
        deadline.check()
        if skipping and packet.size:
            if not packet.is_keyframe:
                continue
            s.codec_context.flush_buffers()  # a clean start: no frame or error from before
            skips.resume(packet)
        skipping = False
        if skips is None:
            yield from packet.decode()
            continue
        try:
            frames = packet.decode()
        except av.FFmpegError as e:
            skips.failed(e)
            skipping = True
            continue
        yield from frames


def lost_tail(src: Source, *, after_s: float, timeout_s: float | None = None) -> str | None:
    """Why decoding `src` ends at `after_s`, before the duration its container states: the file
    is truncated (`container.truncation`: "truncated: sample index needs N bytes, ..."), or the
    decoder fails after that point ("damaged: decoding fails after X s (reason)"). None when
    neither shows (the stream states more than it holds). Decodes from the keyframe before
    ``after_s - 1`` to the end, under `timeout_s` (default: `DECODE_TIMEOUT`)."""
    name = source_name(src)
    began = time.monotonic()
    with open_container(src) as c:
        s = video_stream(c, name)
        cut = truncation(src, s)
        if cut is not None:
            return cut
        deadline = _Deadline(name, timeout_s, media_seconds(c, s))
        deadline.end -= time.monotonic() - began  # the open counts too
        try:
            if after_s > 1.0 and s.time_base is not None:
                at = stream_t0(s) + int((after_s - 1.0) / s.time_base)
                c.seek(at, stream=s, backward=True, any_frame=False)
            for _ in _decode(c, s, deadline):
                pass
        except av.FFmpegError as e:
            return f"damaged: decoding fails after {after_s:.2f} s ({ffmpeg_reason(e)})"
    return None


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
    name = source_name(src)
    n = 0
    for _ in iter_av_frames(src, start_s=None, end_s=None, threads="AUTO", timeout_s=timeout_s):
        n += 1
    if n == 0:
        raise VideoError(name, "video stream has no decodable frame")
    with open_container(src) as c:
        declared = int(video_stream(c, name).frames or 0)
    return FrameCount(decoded=n, declared=declared)
