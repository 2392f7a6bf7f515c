"""`CurateOptions`: the scalar settings of curation, declared once, in a module of their own.

:class:`~vfm_core.curate.config.CurateConfig` is these plus the nested settings (filters,
picture, semdedup) and the frame-size limit. The split is by weight: this module imports neither
PyAV nor numpy, so the ``vfm`` parser generates ``vfm curate``'s flags from these fields
(:func:`vfm_core.config_fields.add_flags`: types, choices, bounds, defaults, the docstrings as
help) without importing the curation stages, and the curation flow's form generates its fields
from the same ones (:func:`vfm_core.config_fields.form_fields`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from vfm_core.config_fields import bounds, flag
from vfm_core.video.choices import AudioMode, Encoder, Preset, SplitterName


@dataclass(kw_only=True, slots=True)
class CurateOptions:
    """The scalar settings of every curation stage (the base of `CurateConfig`)."""

    splitter: SplitterName = "hybrid"
    """Shot detector: colour change + layout cue (hybrid, the default: also finds cuts between
    two shots of one set), colour change only, fixed stride, or TransNetV2."""
    min_len_s: float = field(default=2.0, metadata=bounds(ge=0) | flag("--min-len"))
    """Shortest clip, seconds: a shorter shot is a reject row with its start, end and length."""
    max_len_s: float | None = field(
        default=20.0, metadata=bounds(gt=0) | flag("--max-len", none_as=0)
    )
    """Longest clip, seconds: a longer shot is cut into equal windows no longer than this (None:
    no limit)."""
    stride_s: float = 10.0
    """Window length of the fixed-stride splitter."""
    stitch: bool | None = None
    """Merge touching spans whose boundary frames look alike (undo false cuts). None: on for the
    splitters whose cuts are one signal (color, stride, transnetv2), off for hybrid.

    The hybrid's cuts are one-pair steps in two signals: on real compositions it made no false
    cut, and stitching after it only removed true cuts (2 of 36, both between two shots of one
    set, whose boundary frames look as alike as frames inside one moving shot: cosine 0.66-0.97
    against 0.80-1.0)."""
    stitch_threshold: float = 0.9
    """Cosine similarity of boundary-frame embeddings above which spans merge."""
    analysis_width: int = 64
    """Width of the frames decoded for splitting and filter scores."""
    out_width: int | None = field(default=None, metadata=bounds(ge=1) | flag("--width"))
    """Clip width (aspect kept); None keeps the source size."""
    out_fps: float | None = field(default=None, metadata=bounds(gt=0) | flag("--fps"))
    """Clip frame rate; None keeps the source rate (VFR sources get their average rate)."""
    crf: int = field(default=23, metadata=bounds(ge=0, le=51))
    """libx264 constant quality, 0 (lossless) .. 51; lower is better and bigger."""
    preset: Preset = "veryfast"
    """libx264 preset, the encoder's speed against the clips' bytes: at 720p, ms a frame on 2
    cores, veryfast 6.3-6.6, superfast 4.3, ultrafast 2.9 at 3.6x the bytes (docs/curation.md);
    NVENC gets the p1..p7 preset of similar speed."""
    encoder: Encoder = "auto"
    """H.264 encoder: auto = h264_nvenc where it opens here (GPU build + GPU), else libx264."""
    audio: AudioMode = "keep"
    """Sound: keep = the source's first audio stream over each clip's span, as AAC in sync with
    the pictures (clips of a source without one have none); drop = clips without sound. The
    clips manifest's ``audio`` column says kept, none or dropped per clip."""
    embed_frames: int = 4
    """Frames averaged into a clip embedding."""
    image_model: str | None = None
    """Local directory of a transformers image model for clip embeddings (None: colour
    thumbnails)."""
    vlm: str | None = None
    """Local directory of a transformers image-to-text model for captions (after sidecars)."""
    require_caption: bool = False
    """Reject clips without a caption."""
