"""Embedding vectors: `l2_normalize`, shared by the frame embedders and the caption encoder
(`vfm_core.annotate.embed`, `vfm_core.annotate.text_encoder`), semantic dedup and the search
index."""

from __future__ import annotations

import numpy as np


def l2_normalize(x: np.ndarray) -> np.ndarray:
    """Vectors along the last axis scaled to unit L2 norm (zero vectors stay zero); the dtype
    is kept."""
    return x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), 1e-12)
