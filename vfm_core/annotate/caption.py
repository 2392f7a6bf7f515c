"""Captions through one `Captioner` protocol: sidecar text files, or a VLM from a local directory.

- `SidecarCaptioner`: `<stem>.txt` (the whole file is the caption) or `<stem>.json` next to the
  video (`{"caption": "..."}`, optionally `{"segments": [{"start_s", "end_s", "caption"}]}`: the
  segment overlapping the clip most wins). Works for local paths and `s3://` URLs.
- `VLMCaptioner`: an image-to-text model through `transformers` (`VisionEncoderDecoderModel`,
  BLIP, GIT, or any `AutoModelForImageTextToText` with a processor) loaded from a local path; the
  clip's middle frame is captioned, with an optional text prompt. Nothing is downloaded.
- `ChainCaptioner`: the first captioner that returns something (e.g. sidecar, then VLM).

`setup()` loads models once per worker; `caption(...)` returns a `Caption` or None.
"""

from __future__ import annotations

import json
import os
import posixpath
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol, runtime_checkable

import numpy as np

from vfm_core import storage

CaptionSource = Literal["sidecar", "vlm", "none"]


@dataclass(kw_only=True, slots=True, frozen=True)
class Caption:
    """A caption and where it came from."""

    text: str
    """The caption text (stripped)."""
    source: CaptionSource
    """sidecar | vlm | none."""


@runtime_checkable
class Captioner(Protocol):
    """Anything that captions a clip of a source video."""

    def setup(self) -> None:
        """Load models (once per worker)."""
        ...

    def caption(
        self, *, source_uri: str, start_s: float, end_s: float, frames: np.ndarray
    ) -> Caption | None:
        """Caption of [start_s, end_s) of `source_uri`; `frames` (T, H, W, 3) are the clip's."""
        ...


def _stem_url(uri: str) -> str:
    if storage.is_remote(uri):
        root, _ = posixpath.splitext(uri)
        return root
    return str(Path(uri.removeprefix("file://")).with_suffix(""))


class SidecarCaptioner:
    """Caption from `<stem>.txt` / `<stem>.json` next to the source video."""

    def __init__(self) -> None:
        self._cache: dict[str, Any] = {}

    def setup(self) -> None:
        return None

    def _load(self, uri: str) -> Any:
        if uri in self._cache:
            return self._cache[uri]
        stem = _stem_url(uri)
        found: Any = None
        for ext in (".txt", ".json"):
            url = stem + ext
            if not storage.exists(url):
                continue
            text = storage.read_bytes(url).decode("utf-8", errors="replace")
            if ext == ".txt":
                found = text.strip() or None
            else:
                try:
                    found = json.loads(text)
                except json.JSONDecodeError as e:
                    raise ValueError(f"sidecar caption {url}: invalid JSON ({e})") from None
                if not isinstance(found, dict):
                    raise ValueError(f"sidecar caption {url}: expected a JSON object")
            break
        if len(self._cache) > 256:
            self._cache.clear()
        self._cache[uri] = found
        return found

    def caption(
        self, *, source_uri: str, start_s: float, end_s: float, frames: np.ndarray
    ) -> Caption | None:
        found = self._load(source_uri)
        if found is None:
            return None
        if isinstance(found, str):
            return Caption(text=found, source="sidecar")
        best, best_overlap = None, 0.0
        for seg in found.get("segments") or []:
            ov = min(end_s, float(seg["end_s"])) - max(start_s, float(seg["start_s"]))
            if ov > best_overlap and str(seg.get("caption", "")).strip():
                best, best_overlap = str(seg["caption"]).strip(), ov
        text = best or str(found.get("caption", "")).strip()
        return Caption(text=text, source="sidecar") if text else None


class VLMCaptioner:
    """Image-to-text model from a local directory, captioning the clip's middle frame."""

    def __init__(
        self,
        model_path: str | os.PathLike[str],
        *,
        prompt: str | None = None,
        max_new_tokens: int = 32,
        device: str = "cpu",
    ) -> None:
        self.model_path = Path(model_path)
        self.prompt = prompt
        self.max_new_tokens = max_new_tokens
        self.device = device
        self._model: Any = None
        if not self.model_path.is_dir():
            raise FileNotFoundError(f"VLMCaptioner: model directory {self.model_path} not found")

    def setup(self) -> None:
        if self._model is not None:
            return
        from transformers import (
            AutoConfig,
            AutoImageProcessor,
            AutoModelForImageTextToText,
            AutoProcessor,
            AutoTokenizer,
            VisionEncoderDecoderModel,
        )

        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        path = self.model_path
        cfg = AutoConfig.from_pretrained(path)
        if cfg.model_type == "vision-encoder-decoder":
            model = VisionEncoderDecoderModel.from_pretrained(path)
            self._processor = None
            self._image_processor = AutoImageProcessor.from_pretrained(path)
        else:
            model = AutoModelForImageTextToText.from_pretrained(path)
            self._processor = AutoProcessor.from_pretrained(path)
            self._image_processor = None
        self._tokenizer = AutoTokenizer.from_pretrained(path)
        self._model = model.to(self.device).eval()

    def caption(
        self, *, source_uri: str, start_s: float, end_s: float, frames: np.ndarray
    ) -> Caption | None:
        import torch

        self.setup()
        if len(frames) == 0:
            return None
        image = frames[len(frames) // 2]  # (H, W, 3) middle frame
        if self._processor is None:
            inputs = self._image_processor(images=[image], return_tensors="pt")
        elif self.prompt:
            inputs = self._processor(images=[image], text=[self.prompt], return_tensors="pt")
        else:
            inputs = self._processor(images=[image], return_tensors="pt")
        inputs = inputs.to(self.device)
        with torch.inference_mode():
            out = self._model.generate(
                **inputs, max_new_tokens=self.max_new_tokens, do_sample=False
            )  # (1, L)
        if "input_ids" in inputs and not self._model.config.is_encoder_decoder:
            out = out[:, inputs["input_ids"].shape[1] :]  # decoder-only: drop the prompt
        text = self._tokenizer.batch_decode(out, skip_special_tokens=True)[0].strip()
        return Caption(text=text, source="vlm") if text else None


class ChainCaptioner:
    """Try captioners in order; the first non-empty caption wins."""

    def __init__(self, *captioners: Captioner) -> None:
        self.captioners = captioners

    def setup(self) -> None:
        for c in self.captioners:
            c.setup()

    def caption(
        self, *, source_uri: str, start_s: float, end_s: float, frames: np.ndarray
    ) -> Caption | None:
        for c in self.captioners:
            cap = c.caption(source_uri=source_uri, start_s=start_s, end_s=end_s, frames=frames)
            if cap is not None and cap.text:
                return cap
        return None
