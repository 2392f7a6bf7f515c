"""Video layer: PyAV I/O, synthetic videos with known cuts, shot splitting and stitching.

The curation stages (split -> stitch -> transcode -> annotate) build on these functions; the flow
and the executors call them, never PyAV directly.
"""

from vfm_core.video.io import (
    TranscodeResult,
    VideoError,
    VideoInfo,
    decode_frames,
    encode_h264,
    iter_frames,
    probe,
    transcode_span,
)
from vfm_core.video.shots import (
    ColorChangeSplitter,
    FixedStrideSplitter,
    LengthRules,
    Span,
    Splitter,
    TransNetV2Splitter,
)
from vfm_core.video.stitch import color_thumb_embed, stitch

__all__ = [
    "ColorChangeSplitter",
    "FixedStrideSplitter",
    "LengthRules",
    "Span",
    "Splitter",
    "TransNetV2Splitter",
    "TranscodeResult",
    "VideoError",
    "VideoInfo",
    "color_thumb_embed",
    "decode_frames",
    "encode_h264",
    "iter_frames",
    "probe",
    "stitch",
    "transcode_span",
]
