"""The names a setting picks a shot splitter, an H.264 encoder and what happens to sound by,
declared once.

Stdlib only (the ``vfm`` parser lists them in ``vfm curate --help`` without importing PyAV):
`CurateConfig` types its ``splitter``, ``encoder``, ``preset`` and ``audio`` fields with these, its
``splitter_obj`` maps a splitter name to its class, :func:`vfm_core.video.transcode.select_encoder`
resolves an encoder name, and the clips manifest's contract takes its ``audio`` values from here.
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

Preset = Literal[
    "ultrafast", "superfast", "veryfast", "faster", "fast", "medium", "slow", "slower", "veryslow"
]
"""libx264 presets, fastest first (NVENC gets the p1..p7 preset of similar speed)."""
PRESETS: tuple[str, ...] = typing.get_args(Preset)
"""Accepted values of a `preset` setting."""

AudioMode = Literal["keep", "drop"]
"""What curation does with a source's sound: keep = its first audio stream over the clip's span,
as AAC in the clip (a mono or stereo AAC stream copied, any other re-encoded:
`vfm_core.video.audio`); drop = clips without sound."""
AUDIO_MODES: tuple[str, ...] = typing.get_args(AudioMode)
"""Accepted values of an `audio` setting."""

ClipAudio = Literal["kept", "none", "dropped"]
"""A clip's sound as its manifest records it: kept (the source's, over the clip's span), none
(the source has no audio stream), dropped (the source has one, the run's `audio` was drop)."""
CLIP_AUDIO: tuple[str, ...] = typing.get_args(ClipAudio)
"""Values of the clips manifest's ``audio`` column."""
