"""Encoding: H.264 MP4 from frames (`encode_h264`) and from a span of a video (`transcode_span`,
with the span's sound as AAC where the source has an audio stream: `video.audio`).

The encoder is libx264 (always in PyAV's wheel) or NVIDIA's h264_nvenc where the FFmpeg build has
it and a GPU with a driver lets it open. `select_encoder("auto")` picks NVENC when it opens here
and otherwise libx264, logging why; asking for "h264_nvenc" where it cannot open raises
`EncoderError` naming the setting. Quality settings are libx264's (`crf`, `preset`); for NVENC
they map to constant-quality `cq` and the p1..p7 preset of similar speed.
"""

from __future__ import annotations

import functools
import itertools
import logging
import os
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any

import av
import numpy as np

from vfm_core.video.audio import (
    AudioFormat,
    add_aac,
    audio_format,
    copied_sound,
    span_samples,
    write_aac,
    write_copied,
)
from vfm_core.video.choices import ENCODERS, AudioMode, ClipAudio, Encoder
from vfm_core.video.container import Source, VideoError, open_container, source_name, video_stream
from vfm_core.video.convert import FrameConverter
from vfm_core.video.deinterlace import Deinterlacer
from vfm_core.video.io import ONE_THREAD_PIXELS, analysis_size, iter_av_frames

log = logging.getLogger(__name__)

# libx264 preset -> NVENC preset of similar speed (p1 fastest .. p7 best quality)
_NVENC_PRESETS = {
    "ultrafast": "p1",
    "superfast": "p1",
    "veryfast": "p2",
    "faster": "p3",
    "fast": "p3",
    "medium": "p4",
    "slow": "p5",
    "slower": "p6",
    "veryslow": "p7",
    "placebo": "p7",
}


class EncoderError(RuntimeError):
    """An encoder setting that cannot be honoured here (a configuration error, not a bad video)."""


@functools.cache
def encoder_unavailable(codec: str) -> str | None:
    """None when `codec` opens for encoding on this machine, else why not (cached per process).

    Opening a tiny encoder is the real test for NVENC: the FFmpeg build must contain it and the
    NVIDIA driver must find a GPU with an encoder engine.
    """
    if codec not in av.codecs_available:
        return f"this PyAV/FFmpeg build has no {codec} encoder"
    try:
        cc = av.CodecContext.create(codec, "w")
        cc.width, cc.height, cc.pix_fmt = 256, 144, "yuv420p"
        cc.time_base, cc.framerate = Fraction(1, 24), Fraction(24)
        cc.open()
    except (av.FFmpegError, ValueError, OSError) as e:
        return f"{codec} does not open here (no usable NVIDIA GPU / driver?): {e}"
    return None


def select_encoder(requested: str = "auto", *, setting: str = "encoder") -> str:
    """The encoder to use for `requested` ("auto" | "libx264" | "h264_nvenc").

    "auto" gives h264_nvenc when it opens here, else libx264; the choice (and why) is logged
    once per process, not once per call (a curation run resolves it for every video). `setting`
    names the option in errors and in that line (e.g. "CurateConfig.encoder").
    """
    if requested not in ENCODERS:
        raise EncoderError(f"{setting}: unknown encoder {requested!r}; expected one of {ENCODERS}")
    if requested == "libx264":
        return "libx264"
    why = encoder_unavailable("h264_nvenc")
    if requested == "h264_nvenc":
        if why:
            raise EncoderError(
                f"{setting}='h264_nvenc' is unavailable: {why}; use 'auto' or 'libx264'"
            )
        return "h264_nvenc"
    choice = "libx264" if why else "h264_nvenc"
    _log_choice(setting, choice, why)
    return choice


_CHOICES_LOGGED: set[tuple[str, str | None]] = set()
"""(encoder, why) pairs `select_encoder` has logged in this process."""
_CHOICES_LOCK = threading.Lock()


def _log_choice(setting: str, choice: str, why: str | None) -> None:
    """Log the choice of ``encoder=auto`` the first time this process makes it."""
    with _CHOICES_LOCK:
        if (choice, why) in _CHOICES_LOGGED:
            return
        _CHOICES_LOGGED.add((choice, why))
    log.info("%s=auto: using %s%s", setting, choice, f" ({why})" if why else "")


def _even(x: int) -> int:
    return max(2, x - x % 2)


def x264_threads(width: int, height: int) -> int:
    """libx264 threads for a (width, height) picture: 1 up to `io.ONE_THREAD_PIXELS`, else 0
    (x264's own count)."""
    return 1 if width * height <= ONE_THREAD_PIXELS else 0


def _open_h264(
    out_path: str | os.PathLike[str],
    *,
    fps: float | Fraction,
    width: int,
    height: int,
    crf: int,
    preset: str,
    pix_fmt: str,
    gop: int | None,
    encoder: str = "libx264",
) -> tuple[Any, Any]:
    """An MP4 container and its H.264 stream; `encoder` is a concrete name (not "auto")."""
    Path(out_path).parent.mkdir(parents=True, exist_ok=True)
    out = av.open(os.fspath(out_path), mode="w", options={"movflags": "+faststart"})
    rate = Fraction(fps).limit_denominator(1001) if not isinstance(fps, Fraction) else fps
    st = out.add_stream(encoder, rate=rate)
    st.width, st.height, st.pix_fmt = width, height, pix_fmt
    st.time_base = 1 / rate
    st.codec_context.time_base = 1 / rate
    if encoder == "h264_nvenc":
        # constant quality (VBR with cq, no bitrate cap) ~ libx264 crf; the first frame is IDR
        nv = _NVENC_PRESETS.get(preset, preset)
        st.options = {"rc": "vbr", "cq": str(crf), "b": "0", "preset": nv}
    else:
        st.options = {"crf": str(crf), "preset": preset}
        st.codec_context.thread_count = x264_threads(width, height)
    if gop is not None:
        st.codec_context.gop_size = gop
    return out, st


def encode_h264(
    frames: Iterable[np.ndarray] | np.ndarray,
    out_path: str | os.PathLike[str],
    *,
    fps: float | Fraction,
    width: int | None = None,
    height: int | None = None,
    crf: int = 23,
    preset: str = "veryfast",
    pix_fmt: str = "yuv420p",
    gop: int | None = None,
    encoder: Encoder = "libx264",
    sound: tuple[np.ndarray, int] | None = None,
) -> int:
    """Encode RGB uint8 frames (each (H, W, 3)) to an H.264 MP4; returns frames written.

    Frame 0 is an IDR keyframe. Output size defaults to the first frame's size rounded down to
    even numbers (yuv420p needs even sizes); other sizes are scaled by swscale. `encoder` is
    libx264 by default (bit-reproducible files, e.g. the synthetic test videos); "auto" or
    "h264_nvenc" go through `select_encoder`. `sound`: (C, S) float samples from time 0 (C 1 or
    2) and their rate, written as an AAC track.
    """
    it = iter(frames)
    first = next(it, None)
    if first is None:
        raise ValueError("encode_h264: no frames")
    h0, w0 = first.shape[:2]
    w, h = _even(width or w0), _even(height or h0)
    codec = select_encoder(encoder, setting="encode_h264(encoder=...)")
    out, st = _open_h264(
        out_path,
        fps=fps,
        width=w,
        height=h,
        crf=crf,
        preset=preset,
        pix_fmt=pix_fmt,
        gop=gop,
        encoder=codec,
    )
    if sound is not None:
        samples, rate = sound  # (C, S)
        ast = add_aac(out, AudioFormat(rate=rate, layout="mono" if len(samples) == 1 else "stereo"))
    n = 0
    fc = FrameConverter()  # one swscale context for every frame (a frame's own is built per call)
    with out:
        for arr in _chain(first, it):
            vf = av.VideoFrame.from_ndarray(np.ascontiguousarray(arr), format="rgb24")
            vf = fc.convert(vf, width=w, height=h, format=pix_fmt)
            vf.pts, vf.time_base = n, st.codec_context.time_base
            out.mux(st.encode(vf))
            n += 1
        out.mux(st.encode(None))
        if sound is not None:
            write_aac(out, ast, samples)
    return n


def _chain(first: np.ndarray, rest: Iterator[np.ndarray]) -> Iterator[np.ndarray]:
    yield first
    yield from rest


@dataclass(kw_only=True, slots=True, frozen=True)
class TranscodeResult:
    """What `transcode_span` wrote."""

    path: str
    """The MP4 written."""
    n_frames: int
    """Frames in the clip."""
    duration_s: float
    """n_frames / fps."""
    width: int
    """Clip width in pixels (upright)."""
    height: int
    """Clip height in pixels (upright)."""
    fps: float
    """Clip frame rate."""
    encoder: str = "libx264"
    """The H.264 encoder that wrote it (libx264 or h264_nvenc)."""
    audio: ClipAudio = "none"
    """Its sound: kept (the source's, AAC), none (the source has no audio stream) or dropped."""
    deinterlaced: bool = False
    """The source's frames were interlaced and went through `video.deinterlace` first."""


def transcode_span(
    src: Source,
    out_path: str | os.PathLike[str],
    start_s: float,
    end_s: float,
    *,
    width: int | None = None,
    height: int | None = None,
    fps: float | None = None,
    crf: int = 23,
    preset: str = "veryfast",
    threads: str = "AUTO",
    rotation: int = 0,
    cfr: bool = False,
    encoder: Encoder = "auto",
    crop: tuple[int, int, int, int] | None = None,
    audio: AudioMode = "keep",
    frames: Iterable[tuple[float, av.VideoFrame]] | None = None,
) -> TranscodeResult:
    """Write the frames of [start_s, end_s) of `src` as an H.264 MP4 starting on a keyframe.

    Only the span is decoded: the demuxer seeks to the keyframe before `start_s`, earlier frames
    are decoded and dropped. `width` alone keeps the aspect ratio; `fps` resamples by nearest
    earlier frame (drop / repeat) on the output time grid; `cfr=True` does that even at the input's
    average rate (variable-frame-rate input -> constant-rate clip). `rotation` (degrees
    counter-clockwise, `VideoInfo.rotation`) is applied to the pixels, so the clip is upright
    without a display matrix; `width` / `height` are then the upright size. Non-square source
    pixels (anamorphic DV / HDV: a stated sample aspect ratio) become square: a 720x576 PAL
    16:9 picture (64:45 pixels) is a 1024x576 clip, as it is shown. `encoder` "auto"
    uses h264_nvenc where it opens, else libx264 (see `select_encoder`). Raises `VideoError` if
    the span is empty, `EncoderError` for an encoder that is unknown or unavailable. `crop`
    (x, y, w, h in upright source pixels, e.g. the picture inside black bars from
    `vfm_core.video.quality`) keeps only that box; sizes then apply to the box.

    `audio` "keep" puts the source's first audio stream in the clip (`video.audio`: a mono or
    stereo AAC stream's packets copied, any other re-encoded as AAC): from the source time of
    its first frame (of ``start_s`` when frames are resampled onto a new time grid) for
    n_frames / fps seconds, so sound and pictures stay in sync; "drop" writes no
    sound. `TranscodeResult.audio` says which happened (none: the source has no audio stream).

    Interlaced frames (camcorder 1080i, broadcast) are made progressive first
    (`video.deinterlace`, FFmpeg's bwdif; `TranscodeResult.deinterlaced`).

    `frames`: the span's (time_s, frame) already decoded (`iter_av_frames` over [start_s,
    end_s), e.g. for the picture checks), encoded instead of decoding the span again.
    """
    codec = select_encoder(encoder, setting="transcode_span(encoder=...)")
    name = source_name(src)
    deinterlace = Deinterlacer()  # interlaced frames made progressive, others untouched
    if frames is None:
        frames = iter_av_frames(src, start_s=start_s, end_s=end_s, threads=threads, name=name)
    frames = iter(frames)
    head = next(frames, None)
    if head is None:  # (nothing written yet)
        raise VideoError(name, f"no frames in span [{start_s:.3f}, {end_s:.3f}) s")
    # the span's own picture size (a stream may switch resolution: the split cuts there)
    w0, h0 = head[1].width, head[1].height
    with open_container(src) as c:  # the header, and the sound's packets when they are copied
        in_rate, sound, sar = _header(c, name)
        keep = sound is not None and audio == "keep"
        copied = copied_sound(c, start_s, end_s, name=name) if keep and sound.copy else None
        k = (rotation // 90) % 4  # quarter turns counter-clockwise
        w, h = _output_size(w0, h0, k=k, crop=crop, sar=sar, width=width, height=height, name=name)
        out_rate = Fraction(fps).limit_denominator(1001) if fps else Fraction(in_rate)
        out, st = _open_h264(
            out_path,
            fps=out_rate,
            width=w,
            height=h,
            crf=crf,
            preset=preset,
            pix_fmt="yuv420p",
            gop=None,
            encoder=codec,
        )
        if copied is not None:
            ast = out.add_stream_from_template(c.streams.audio[0])
        else:
            ast = add_aac(out, sound) if keep else None
    n, first_t = 0, start_s
    fc = FrameConverter()  # swscale contexts reused across the span, one per conversion
    with out:
        resample = cfr or (fps is not None and abs(float(out_rate) - float(in_rate)) > 1e-6)
        for t, frame in deinterlace(itertools.chain([head], frames)):
            first_t = t if n == 0 and not resample else first_t  # the clip's time 0
            vf = _upright_frame(fc, frame, k=k, crop=crop, width=w, height=h)
            copies = 1
            if resample:
                copies = _grid_copies(
                    n, t - start_s, span=(start_s, end_s), rates=(in_rate, out_rate)
                )
            if n == 0:
                _tag_colours(st.codec_context, vf)
            for _ in range(copies):
                vf.pts, vf.time_base = n, st.codec_context.time_base
                out.mux(st.encode(vf))
                n += 1
        out.mux(st.encode(None))
        if ast is not None and n:  # the sound of [first_t, first_t + n / rate): the clip's span
            dur = float(n / out_rate)
            if copied is not None:
                write_copied(out, ast, copied, first_t, dur)
            else:  # (C, S) samples
                write_aac(out, ast, span_samples(src, first_t, dur, sound, name=name))
    if n == 0:
        Path(out_path).unlink(missing_ok=True)
        raise VideoError(name, f"no frames in span [{start_s:.3f}, {end_s:.3f}) s")
    return TranscodeResult(
        path=os.fspath(out_path),
        n_frames=n,
        duration_s=n / float(out_rate),
        width=w,
        height=h,
        fps=float(out_rate),
        encoder=codec,
        audio="none" if sound is None else "kept" if ast is not None else "dropped",
        deinterlaced=deinterlace.used,
    )


def _header(
    c: av.container.InputContainer, name: str
) -> tuple[Fraction, AudioFormat | None, Fraction]:
    """An open source's frame rate (30 when it declares none), the format of the clip's sound
    (None: no audio stream) and the shape of its pixels (sample aspect ratio, 1 when square or
    not stated, or past 4:1 either way: a bogus header)."""
    s = video_stream(c, name)
    sar = s.sample_aspect_ratio
    sar = Fraction(sar) if sar is not None and Fraction(1, 4) <= sar <= 4 else Fraction(1)
    return s.average_rate or s.guessed_rate or Fraction(30), audio_format(c), sar


def _output_size(
    w0: int,
    h0: int,
    *,
    k: int,
    crop: tuple[int, int, int, int] | None,
    sar: Fraction = Fraction(1),
    width: int | None,
    height: int | None,
    name: str,
) -> tuple[int, int]:
    """Even (width, height) of the clip of a (w0, h0) coded picture turned upright by ``k``
    quarter turns and cut to ``crop`` (VideoError when the box is not inside the picture), in
    square pixels (a source's pixels `sar` wide for 1 high, e.g. anamorphic DV or HDV, are
    stretched along the coded width); ``width`` alone keeps the aspect ratio."""
    if k % 2:
        w0, h0 = h0, w0  # upright size
    if crop is not None:
        cx, cy, cw, ch = crop
        if cw < 2 or ch < 2 or cx < 0 or cy < 0 or cx + cw > w0 or cy + ch > h0:
            raise VideoError(name, f"crop {crop} is not inside the {w0}x{h0} picture")
        w0, h0 = cw, ch
    if sar != 1:  # the coded width is upright height after a quarter turn
        w0, h0 = (w0, round(h0 * sar)) if k % 2 else (round(w0 * sar), h0)
    if height is None:
        w, h = analysis_size(w0, h0, width) if width else (w0, h0)
    else:
        w, h = width or w0, height
    return _even(w), _even(h)


def _upright_frame(
    fc: FrameConverter,
    frame: av.VideoFrame,
    *,
    k: int,
    crop: tuple[int, int, int, int] | None,
    width: int,
    height: int,
) -> av.VideoFrame:
    """A decoded frame as the clip's yuv420p (height, width) frame: turned upright by ``k``
    quarter turns counter-clockwise, cut to ``crop`` (upright source pixels) and scaled."""
    w, h = width, height
    if (
        crop is not None
        and not k
        and frame.format.name == "yuv420p"
        and not any(c % 2 for c in crop)
    ):
        return fc.convert(_crop_yuv420p(frame, crop), width=w, height=h, format="yuv420p")
    if crop is not None:  # other formats, odd boxes, turned pictures: through RGB
        cx, cy, cw, ch = crop
        a = fc.convert(frame, format="rgb24").to_ndarray()  # (H0, W0, 3) coded
        a = np.rot90(a, k) if k else a  # upright
        a = a[cy : cy + ch, cx : cx + cw]  # (ch, cw, 3) the picture inside the box
        vf = av.VideoFrame.from_ndarray(np.ascontiguousarray(a), "rgb24")
        return fc.convert(vf, width=w, height=h, format="yuv420p")
    if k:
        # rotate the coded picture upright: (h0', w0', 3) -> np.rot90 is counter-clockwise
        cw, ch = (h, w) if k % 2 else (w, h)
        a = fc.convert(frame, format="rgb24", width=cw, height=ch).to_ndarray()
        vf = av.VideoFrame.from_ndarray(np.ascontiguousarray(np.rot90(a, k)), "rgb24")
        return fc.convert(vf, format="yuv420p")
    return fc.convert(frame, width=w, height=h, format="yuv420p")


def _tag_colours(cc: Any, vf: av.VideoFrame) -> None:
    """Before the encoder opens: state the colour space, range, primaries and transfer of the
    frames it gets, so the clip decodes to the source's colours (a BT.709 source's samples,
    written unstated, read back as BT.601). Frames made from RGB state nothing: left unstated,
    they are BT.601, as swscale wrote them."""
    for name in ("colorspace", "color_range", "color_primaries", "color_trc"):
        setattr(cc, name, getattr(vf, name))


def _crop_yuv420p(frame: av.VideoFrame, crop: tuple[int, int, int, int]) -> av.VideoFrame:
    """The even box ``crop`` (x, y, w, h) of a yuv420p frame, cut from its planes: no colour
    conversion (a round trip through RGB cost 2 conversions a frame and rounded every pixel)."""
    cx, cy, cw, ch = crop
    half = (cx // 2, cy // 2, cw // 2, ch // 2)  # the box on the half-size chroma planes
    planes = [
        np.frombuffer(p, np.uint8).reshape(-1, p.line_size)[y : y + h, x : x + w].ravel()
        for p, (x, y, w, h) in zip(frame.planes[:3], (crop, half, half), strict=True)
    ]  # Y (ch * cw), U and V (ch / 2 * cw / 2 each)
    yuv = np.concatenate(planes).reshape(ch * 3 // 2, cw)  # Y rows, then U and V packed
    out = av.VideoFrame.from_ndarray(yuv, format="yuv420p")
    out.colorspace, out.color_range = frame.colorspace, frame.color_range
    return out


def _grid_copies(
    n: int, rel: float, *, span: tuple[float, float], rates: tuple[Fraction, Fraction]
) -> int:
    """Repeat / drop onto the output time grid: how many times the input frame at ``rel``
    seconds into the span is written once ``n`` output frames are — one per output frame whose
    grid time falls before the next input frame and inside ``span`` (start_s, end_s); 0 drops
    it. ``rates``: (input, output) frames per second."""
    (start_s, end_s), (in_rate, out_rate) = span, rates
    m = n
    while m / float(out_rate) <= rel + 0.5 / float(in_rate) and (
        start_s + m / float(out_rate) < end_s - 1e-9
    ):
        m += 1
    return m - n
