"""Pixel conversion with reused swscale contexts, one per distinct conversion.

A frame's own `to_ndarray(format=..., width=...)` / `reformat(...)` builds a new swscale context
per call (~2x the decode's cost at 64 px). One `VideoReformatter` kept for a whole clip avoids
that, but a context must serve one conversion only: reusing it for another source or
destination (format, size, colour space) rebuilds its state in place, and FFmpeg's re-initialised
context was seen to give slightly different pixels from run to run (the rotated-transcode path
converts decoded YUV -> RGB and rotated RGB -> YUV on every frame). `FrameConverter` therefore
keys a context by the whole conversion, so each context only ever sees one.
"""

from __future__ import annotations

import av
from av.video.reformatter import VideoReformatter

__all__ = ["FrameConverter"]


class FrameConverter:
    """`convert(frame, format=, width=, height=, interpolation=)` like `frame.reformat`, with one
    cached swscale context per (source format, size, colour space, range; destination format,
    size, interpolation)."""

    def __init__(self) -> None:
        self._contexts: dict[tuple, VideoReformatter] = {}

    def convert(
        self,
        frame: av.VideoFrame,
        *,
        format: str,
        width: int | None = None,
        height: int | None = None,
        interpolation: str | None = None,
        src_colorspace: str | None = None,
    ) -> av.VideoFrame:
        """`frame` as `format` at (`width`, `height`); `src_colorspace` overrides the colour
        space the frame states (e.g. "ITU601")."""
        key = (
            frame.format.name,
            frame.width,
            frame.height,
            src_colorspace or frame.colorspace,
            frame.color_range,
            format,
            width,
            height,
            interpolation,
        )
        rf = self._contexts.get(key)
        if rf is None:
            rf = self._contexts[key] = VideoReformatter()
        return rf.reformat(
            frame,
            format=format,
            width=width,
            height=height,
            interpolation=interpolation,
            src_colorspace=src_colorspace,
        )
