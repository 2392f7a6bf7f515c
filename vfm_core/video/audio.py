"""A clip's sound: the source's first audio stream over the clip's span, as AAC in the clip's MP4.

`audio_format(container)` says whether an open source has sound and how its clips carry it (the
first audio stream's sample rate and channels, as AAC takes them, and whether its packets can be
copied). A mono or stereo AAC stream is copied: `copied_sound` gathers its packets over the span
and `write_copied` puts them in the clip, no decode and no encode. Any other stream is
re-encoded: `span_samples` decodes it over [start_s, start_s + duration_s) as float samples
(C, S); `add_aac` / `write_aac` put them in the clip. `transcode.transcode_span` calls them
after a clip's pictures.

Times are seconds on the video stream's clock (relative to its first timestamp, as in
`video.io`), so a clip's sound starts at its first frame even where the audio stream starts
earlier or later than the video. Where the stream has no samples (it starts late, has a gap,
ends early) the clip has silence: its sound always spans the clip's whole duration.

Copied packets still cut to the sample: an AAC packet holds 1024 samples (21 ms at 48 kHz), so
the clip gets the packets from the one before its first sample (the decoder's pre-roll: AAC
frames overlap by one) to the one holding its last, timed so the first sample is at 0. The MP4
muxer writes the part before 0 as an edit list (players and FFmpeg's demuxer skip it) and the
last packet's duration ends the stream at the clip's end. Where the packets do not cover the
span (the stream starts late, has a gap, ends early) the sound is re-encoded with silence
filled in. Copying costs no decode and no encode: re-encoding a 160x90 clip's sound cost as much
as encoding its pictures. (Two decodes of the same AAC stream started at different packets
differ by noise-substitution bands, ~21 dB SNR on a web music video; the copy is no further
from the source than a re-encode is.)
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from fractions import Fraction

import av
import numpy as np

from vfm_core.video.container import (
    Source,
    VideoError,
    ffmpeg_reason,
    open_container,
    source_name,
    stream_t0,
    video_stream,
)
from vfm_core.video.io import DECODE_TIMEOUT

AAC_RATES = (96000, 88200, 64000, 48000, 44100, 32000, 24000, 22050, 16000, 12000, 11025, 8000)
"""Sample rates AAC codes; a source at another rate is resampled to 48 kHz."""

AAC_OPTIONS: dict[str, str] = {"aac_coder": "fast"}
"""FFmpeg's native AAC encoder with its fast quantiser search instead of the default two-loop
one: ~2x faster at the same 128 kbit/s (the two-loop search cost as much as encoding the
pictures of a 160x90 clip); the sound of a training clip needs no more."""

_CHUNK = (
    1 << 16
)  # samples per frame handed to the encoder (it re-cuts them into 1024-sample frames)


@dataclass(kw_only=True, slots=True, frozen=True)
class AudioFormat:
    """How a clip carries its source's sound."""

    rate: int
    """Samples per second (the source's when AAC codes it, else 48000)."""
    layout: str
    """"mono" for a one-channel source, else "stereo" (more channels are mixed down)."""
    copy: bool = False
    """The source's stream is AAC of this rate and layout with its decoder configuration: its
    packets go into the clip as they are (`copied_sound`), else it is decoded and re-encoded."""

    @property
    def channels(self) -> int:
        return 1 if self.layout == "mono" else 2


def audio_format(c: av.container.InputContainer) -> AudioFormat | None:
    """The format of an open source's first audio stream in a clip; None when it has no audio
    stream (or one that states no sample rate or channels: nothing a decoder could play)."""
    if not c.streams.audio:
        return None
    cc = c.streams.audio[0].codec_context
    rate, channels = cc.sample_rate or 0, cc.channels or 0
    if rate <= 0 or channels <= 0:
        return None
    return AudioFormat(
        rate=rate if rate in AAC_RATES else 48000,
        layout="mono" if channels == 1 else "stereo",
        # raw AAC frames with their AudioSpecificConfig (MP4, MKV, FLV), not ADTS (MPEG-TS)
        copy=cc.name == "aac" and channels <= 2 and rate in AAC_RATES and bool(cc.extradata),
    )


@dataclass(kw_only=True, slots=True)
class CopiedSound:
    """A source's AAC packets over a span (`copied_sound`), to go into a clip (`write_copied`)."""

    packets: list[av.Packet]
    """In order, each one starting where the one before ends."""
    time_base: Fraction
    origin: Fraction
    """Stream seconds of video-clock time 0 (`video.io` times are relative to it)."""

    def pts(self, t_s: float) -> int:
        """The packet time of video-clock second `t_s`."""
        return round((self.origin + Fraction(t_s)) / self.time_base)


def copied_sound(
    c: av.container.InputContainer,
    start_s: float,
    end_s: float,
    *,
    name: str,
    margin_s: float = 0.1,
) -> CopiedSound | None:
    """The first audio stream's packets of an open source from the one before video-clock second
    ``start_s - margin_s`` (pre-roll; not before the video's first frame, 0) past ``end_s +
    margin_s`` (not past the video stream's end), when they cover that range with no gap; None
    when they do not (the caller re-encodes and fills silence). The margins hold the clip's own
    start and end, which are its frames' (up to half a frame from the span's). Raises
    `VideoError` when the stream cannot be read."""
    v, a = video_stream(c, name), c.streams.audio[0]
    tb = a.time_base
    if tb is None:
        return None
    got = CopiedSound(packets=[], time_base=tb, origin=stream_t0(v) * v.time_base)
    video_end = float(v.duration * v.time_base) if v.duration else end_s + margin_s
    lo, hi = got.pts(max(start_s - margin_s, 0.0)), got.pts(min(end_s + margin_s, video_end))
    if start_s - margin_s > 1.0:  # else from the first packet: a seek to 0 skips the priming one
        c.seek(got.pts(start_s - margin_s - 1.0), stream=a, backward=True)
    try:
        for p in c.demux(a):
            if p.pts is None or not p.duration:  # the demuxer's last, empty packet
                continue
            if p.pts + 2 * p.duration <= lo:  # ends before the pre-roll packet
                continue
            if got.packets and p.pts != got.packets[-1].pts + got.packets[-1].duration:
                return None  # a gap or an overlap: the samples in between are not in packets
            got.packets.append(p)
            if p.pts + p.duration >= hi:
                break
    except av.FFmpegError as e:
        raise VideoError(
            name, f"audio read failed ({ffmpeg_reason(e)}); --audio drop keeps the pictures"
        ) from e
    ps = got.packets
    if not ps or ps[0].pts + ps[0].duration > lo or ps[-1].pts + ps[-1].duration < hi:
        return None  # starts late (no pre-roll before the span) or ends early
    return got


def write_copied(
    out: av.container.OutputContainer,
    st: av.AudioStream,
    sound: CopiedSound,
    start_s: float,
    duration_s: float,
) -> None:
    """Mux the packets of [start_s, start_s + duration_s) (video-clock seconds) into `st` (added
    from the source stream as template), the one before it as pre-roll, timed so `start_s` is 0
    and the last one ends the stream at `duration_s` (the packets are retimed: `sound` is used
    once)."""
    zero, end = sound.pts(start_s), sound.pts(start_s + duration_s)
    for p in sound.packets:
        if p.pts + 2 * p.duration <= zero or p.pts >= end:
            continue
        p.duration = min(p.duration, end - p.pts)
        p.pts -= zero
        p.dts = p.pts
        p.stream = st
        out.mux(p)


def span_samples(
    src: Source,
    start_s: float,
    duration_s: float,
    fmt: AudioFormat,
    *,
    name: str | None = None,
    timeout_s: float | None = None,
) -> np.ndarray:
    """(C, S) float32 samples of `src`'s first audio stream over [start_s, start_s + duration_s)
    (video-clock seconds), S = round(duration_s * fmt.rate); silence where the stream has none.

    Raises `VideoError` when the stream cannot be decoded (the reason says that ``--audio drop``
    keeps the pictures) or decoding takes longer than `timeout_s` (default: `DECODE_TIMEOUT`).
    """
    name = name or source_name(src)
    out = np.zeros((fmt.channels, round(duration_s * fmt.rate)), np.float32)  # (C, S)
    deadline = time.monotonic() + (
        DECODE_TIMEOUT.seconds(duration_s) if timeout_s is None else timeout_s
    )
    with open_container(src) as c:
        v, a = video_stream(c, name), c.streams.audio[0]
        origin = float(stream_t0(v) * v.time_base) + start_s  # stream seconds of sample 0
        end = origin + duration_s
        if origin > 1.0:  # from a second before: the frames before the cut prime the decoder
            c.seek(int((origin - 1.0) / a.time_base), stream=a, backward=True)
        resampler = av.AudioResampler(format="fltp", layout=fmt.layout, rate=fmt.rate)
        try:
            for packet in c.demux(a):
                if time.monotonic() > deadline:
                    raise VideoError(name, "audio decode exceeded its timeout")
                for frame in packet.decode():  # the last, empty packet flushes the decoder
                    for f in resampler.resample(frame):
                        _place(out, f, origin=origin, rate=fmt.rate)
                if packet.pts is not None and float(packet.pts * a.time_base) > end:
                    break
            for f in resampler.resample(None):
                _place(out, f, origin=origin, rate=fmt.rate)
        except av.FFmpegError as e:
            raise VideoError(
                name, f"audio decode failed ({ffmpeg_reason(e)}); --audio drop keeps the pictures"
            ) from e
    return out


def _place(out: np.ndarray, frame: av.AudioFrame, *, origin: float, rate: int) -> None:
    """Copy the samples of `frame` that fall inside `out` (whose sample 0 is at `origin`)."""
    if frame.pts is None or frame.time_base is None:
        return
    at = round((float(frame.pts * frame.time_base) - origin) * rate)  # index of its first sample
    data = frame.to_ndarray()  # (C, n) planar float
    a, b = max(at, 0), min(at + data.shape[1], out.shape[1])
    if a < b:
        out[:, a:b] = data[:, a - at : b - at]


def add_aac(out: av.container.OutputContainer, fmt: AudioFormat) -> av.AudioStream:
    """An AAC stream of `fmt` in `out` (added before anything is muxed)."""
    st = out.add_stream("aac", rate=fmt.rate, layout=fmt.layout)
    st.time_base = Fraction(1, fmt.rate)
    st.options = dict(AAC_OPTIONS)
    return st


def write_aac(out: av.container.OutputContainer, st: av.AudioStream, samples: np.ndarray) -> None:
    """Encode (C, S) float samples from time 0 into `st` and mux them."""
    rate = st.codec_context.sample_rate
    for i in range(0, samples.shape[1], _CHUNK):
        chunk = np.ascontiguousarray(samples[:, i : i + _CHUNK])  # (C, n)
        f = av.AudioFrame.from_ndarray(chunk, format="fltp", layout=st.codec_context.layout.name)
        f.sample_rate, f.pts, f.time_base = rate, i, Fraction(1, rate)
        out.mux(st.encode(f))
    out.mux(st.encode(None))
