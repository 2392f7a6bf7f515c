"""Video layer: PyAV I/O, synthetic videos with known cuts, shot splitting and stitching.

The curation stages (split -> stitch -> transcode -> annotate) build on these functions; the flow
and the executors call them, never PyAV directly.
"""

from vfm_core.video.hybrid_splitter import HybridSplitter
from vfm_core.video.io import VideoError, VideoInfo, decode_frames, iter_frames, probe
from vfm_core.video.shots import ColorChangeSplitter, FixedStrideSplitter, Splitter
from vfm_core.video.spans import DroppedSpan, LengthRules, Segmentation, Span
from vfm_core.video.stitch import color_thumb_embed, stitch
from vfm_core.video.transcode import (
    EncoderError,
    TranscodeResult,
    encode_h264,
    select_encoder,
    transcode_span,
)
from vfm_core.video.transnet import TransNetV2Splitter

__all__ = [
    "ColorChangeSplitter",
    "DroppedSpan",
    "EncoderError",
    "FixedStrideSplitter",
    "HybridSplitter",
    "LengthRules",
    "Segmentation",
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
    "select_encoder",
    "stitch",
    "transcode_span",
]
