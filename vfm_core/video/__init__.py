"""Video layer: PyAV I/O, synthetic videos with known cuts, shot splitting and stitching.

The curation stages (split -> stitch -> transcode -> annotate) build on these functions; the flow
and the executors call them, never PyAV directly.

Names are imported lazily so that a light module of the layer (`choices`: the splitter and
encoder names `vfm --help` lists) is imported without PyAV and numpy.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "ColorChangeSplitter": "shots",
    "DroppedSpan": "spans",
    "EncoderError": "transcode",
    "FixedStrideSplitter": "shots",
    "HybridSplitter": "hybrid_splitter",
    "LengthRules": "spans",
    "Segmentation": "spans",
    "Span": "spans",
    "Splitter": "shots",
    "TransNetV2Splitter": "transnet",
    "TranscodeResult": "transcode",
    "VideoError": "io",
    "VideoInfo": "io",
    "color_thumb_embed": "stitch",
    "decode_frames": "io",
    "encode_h264": "transcode",
    "iter_frames": "io",
    "probe": "io",
    "select_encoder": "transcode",
    "transcode_span": "transcode",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(f"vfm_core.video.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module 'vfm_core.video' has no attribute {name!r}")
