"""A clip's sound: the source's first audio stream over the clip's span, as AAC in the clip's MP4.

`audio_format(container)` says whether an open source has sound and how its clips carry it (the
first audio stream's sample rate and channels, as AAC takes them); `span_samples` decodes that
stream over [start_s, start_s + duration_s) as float samples (C, S); `add_aac` / `write_aac` put
them in a clip being written. `transcode.transcode_span` calls them after a clip's pictures.

Times are seconds on the video stream's clock (relative to its first timestamp, as in
`video.io`), so a clip's sound starts at its first frame even where the audio stream starts
earlier or later than the video. Where the stream has no samples (it starts late, has a gap,
ends early) the clip has silence: its sound always spans the clip's whole duration.

The sound is re-encoded, not copied: an AAC packet holds 1024 samples (21 ms at 48 kHz), so
copied packets would start up to a packet away from the cut and overlap the next clip.
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
        rate=rate if rate in AAC_RATES else 48000, layout="mono" if channels == 1 else "stereo"
    )


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
