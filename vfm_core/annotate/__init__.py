"""Annotation of clips: embeddings (`embed`), captions (`caption`) and filter scores (`filters`)."""

from vfm_core.annotate.caption import (
    Caption,
    Captioner,
    ChainCaptioner,
    CurateCaptioner,
    SidecarCaptioner,
    SidecarError,
    VLMCaptioner,
)
from vfm_core.annotate.embed import (
    CaptionTextEmbedder,
    ColorThumbEmbedder,
    Embedder,
    HFImageEmbedder,
    clip_embedding,
)
from vfm_core.annotate.filters import FilterConfig, FilterScores, reject_reasons, score_frames

__all__ = [
    "Caption",
    "CaptionTextEmbedder",
    "Captioner",
    "ChainCaptioner",
    "ColorThumbEmbedder",
    "CurateCaptioner",
    "Embedder",
    "FilterConfig",
    "FilterScores",
    "HFImageEmbedder",
    "SidecarCaptioner",
    "SidecarError",
    "VLMCaptioner",
    "clip_embedding",
    "reject_reasons",
    "score_frames",
]
