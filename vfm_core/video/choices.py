"""The names a setting picks a shot splitter and an H.264 encoder by, declared once.

Stdlib only (the ``vfm`` parser lists them in ``vfm curate --help`` without importing PyAV):
`CurateConfig` types its ``splitter`` and ``encoder`` fields with these, its ``splitter_obj``
maps a splitter name to its class, and :func:`vfm_core.video.transcode.select_encoder` resolves
an encoder name.
"""

from __future__ import annotations

import typing
from typing import Literal

SplitterName = Literal["hybrid", "color", "stride", "transnetv2"]
"""Shot detectors: colour change + layout cue (`hybrid_splitter`), colour change only
(`shots.ColorChangeSplitter`), fixed stride (`shots.FixedStrideSplitter`), TransNetV2."""
SPLITTERS: tuple[str, ...] = typing.get_args(SplitterName)

Encoder = Literal["auto", "libx264", "h264_nvenc"]
"""H.264 encoders: auto = h264_nvenc where it opens here, else libx264."""
ENCODERS: tuple[str, ...] = typing.get_args(Encoder)
"""Accepted values of an `encoder` setting."""
