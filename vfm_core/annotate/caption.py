"""Captions through one `Captioner` protocol: sidecar files, or a VLM from a local directory.

- `SidecarCaptioner`: a caption file beside the video, same stem (`clip.mp4` -> `clip.txt` or
  `clip.json`; `.txt` wins when both exist), local or `s3://`, UTF-8 (a BOM is allowed):

  - `<stem>.txt`: the whole file (stripped) is the caption of every clip of the video.
  - `<stem>.json`: an object ``{"caption": "the whole video", "segments": [{"start_s": 0.0,
    "end_s": 4.2, "caption": "a red circle moving right"}, ...]}``; both keys are optional,
    times are seconds of the source video. A segment's caption is a clip's caption only when the
    segment covers the majority (> 50 %) of the clip's duration (`segment_caption`); otherwise
    the clip gets the video's ``caption`` (or none).

  A sidecar that is not UTF-8, not JSON, or has wrong fields raises `SidecarError` naming the file.
- `VLMCaptioner`: an image-to-text model through `transformers` (`VisionEncoderDecoderModel`,
  BLIP, GIT, or any `AutoModelForImageTextToText` with a processor) loaded from a local path; the
  clip's middle frame is captioned, with an optional text prompt. Nothing is downloaded.
- `ChainCaptioner`: the first captioner that returns something (e.g. sidecar, then VLM).
- `CurateCaptioner`: what curation runs: the sidecar, then the VLM if one is set; always returns a
  `Caption` (source ``none`` when nothing captions the clip) whose ``problem`` names an unusable
  sidecar, which is then passed over (the clip is kept, without that caption).

Every caption carries its provenance, the manifest's ``caption_source``: ``segment`` (a sidecar
segment), ``sidecar`` (the sidecar's whole-video caption or `.txt`), ``vlm`` or ``none``.
`setup()` loads models once per worker; `caption(...)` returns a `Caption` or None.
"""

from __future__ import annotations

import json
import os
import posixpath
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol, runtime_checkable

import numpy as np

from vfm_core import storage
from vfm_core.errors import UserError

CaptionSource = Literal["sidecar", "segment", "vlm", "none"]
CAPTION_SOURCES: tuple[str, ...] = ("sidecar", "segment", "vlm", "none")
"""Values of the manifest's ``caption_source`` column."""

SIDECAR_SUFFIXES = (".txt", ".json")
"""Sidecar caption files beside a video, in the order they are looked for."""


@dataclass(kw_only=True, slots=True, frozen=True)
class Caption:
    """A caption and where it came from."""

    text: str
    """The caption text (stripped; empty only when ``source`` is ``none``)."""
    source: CaptionSource
    """segment | sidecar | vlm | none."""
    problem: str | None = None
    """Why a sidecar was passed over (e.g. not UTF-8), naming the file; None when it was fine."""


class SidecarError(UserError, ValueError):
    """A sidecar caption file that cannot be used: not UTF-8, not JSON, or wrong fields."""

    def __init__(self, url: str, reason: str) -> None:
        self.url, self.reason = url, reason
        super().__init__(f"sidecar caption {url}: {reason}")


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


@dataclass(kw_only=True, slots=True, frozen=True)
class Segment:
    """A time range of the source video with its caption (a JSON sidecar's ``segments`` entry)."""

    start_s: float
    end_s: float
    caption: str


@dataclass(kw_only=True, slots=True, frozen=True)
class Sidecar:
    """A parsed sidecar: the whole-video caption and the segment captions."""

    caption: str
    """Whole-video caption ('' when there is none)."""
    segments: tuple[Segment, ...] = ()


def parse_sidecar(url: str, data: bytes) -> Sidecar:
    """The caption(s) of a `.txt` or `.json` sidecar's bytes; `SidecarError` names what is wrong."""
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        bad = data[e.start : e.start + 1].hex()
        raise SidecarError(
            url, f"not UTF-8 text (byte 0x{bad} at offset {e.start}); save it as UTF-8"
        ) from None
    if not url.endswith(".json"):
        return Sidecar(caption=text.strip())
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as e:
        raise SidecarError(url, f"invalid JSON ({e})") from None
    if not isinstance(obj, dict):
        raise SidecarError(url, f"expected a JSON object, got {type(obj).__name__}")
    caption = obj.get("caption", "")
    if not isinstance(caption, str):
        raise SidecarError(url, f'"caption" must be a string, got {type(caption).__name__}')
    raw = obj.get("segments") or []
    if not isinstance(raw, list):
        raise SidecarError(url, f'"segments" must be a list, got {type(raw).__name__}')
    segments = []
    for i, seg in enumerate(raw):
        where = f"segments[{i}]"
        if not isinstance(seg, dict):
            raise SidecarError(url, f"{where} must be an object with start_s, end_s, caption")
        start, end, cap = seg.get("start_s"), seg.get("end_s"), seg.get("caption", "")
        if not all(isinstance(t, int | float) and not isinstance(t, bool) for t in (start, end)):
            raise SidecarError(url, f"{where} needs numbers start_s and end_s (seconds)")
        if not end > start:
            raise SidecarError(url, f"{where}: end_s {end} must be after start_s {start}")
        if not isinstance(cap, str):
            raise SidecarError(url, f"{where}: caption must be a string")
        segments.append(Segment(start_s=float(start), end_s=float(end), caption=cap.strip()))
    return Sidecar(caption=caption.strip(), segments=tuple(segments))


def segment_caption(segments: Sequence[Segment], start_s: float, end_s: float) -> str | None:
    """The caption of the segment that covers the majority (> 50 %) of [start_s, end_s), or
    None: a segment that overlaps a clip only a little (a 0.16 s shot boundary) does not caption
    it. With overlapping segments, the one covering most of the clip wins."""
    need = 0.5 * (end_s - start_s)
    best, best_overlap = None, need
    for seg in segments:
        overlap = min(end_s, seg.end_s) - max(start_s, seg.start_s)
        if overlap > best_overlap and seg.caption:
            best, best_overlap = seg.caption, overlap
    return best


class SidecarCaptioner:
    """Caption from `<stem>.txt` / `<stem>.json` beside the source video (see the module doc)."""

    def __init__(self) -> None:
        self._cache: dict[str, Sidecar | SidecarError | None] = {}

    def setup(self) -> None:
        return None

    def _load(self, uri: str) -> Sidecar | None:
        if uri not in self._cache:
            if len(self._cache) > 256:
                self._cache.clear()
            self._cache[uri] = self._read(uri)
        found = self._cache[uri]
        if isinstance(found, SidecarError):
            raise found
        return found

    @staticmethod
    def _read(uri: str) -> Sidecar | SidecarError | None:
        stem = _stem_url(uri)
        for ext in SIDECAR_SUFFIXES:
            url = stem + ext
            if storage.exists(url):
                try:
                    return parse_sidecar(url, storage.read_bytes(url))
                except SidecarError as e:
                    return e
                except OSError as e:  # a directory, a FIFO (refused unopened), unreadable
                    reason = e.reason if isinstance(e, storage.StorageError) else str(e)
                    return SidecarError(url, f"cannot be read: {reason}")
        return None

    def caption(
        self, *, source_uri: str, start_s: float, end_s: float, frames: np.ndarray
    ) -> Caption | None:
        found = self._load(source_uri)
        if found is None:
            return None
        seg = segment_caption(found.segments, start_s, end_s)
        if seg:
            return Caption(text=seg, source="segment")
        return Caption(text=found.caption, source="sidecar") if found.caption else None


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
            model = VisionEncoderDecoderModel.from_pretrained(path, use_safetensors=True)
            self._processor = None
            self._image_processor = AutoImageProcessor.from_pretrained(path)
        else:
            model = AutoModelForImageTextToText.from_pretrained(path, use_safetensors=True)
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


class CurateCaptioner:
    """The captioner of curation: the sidecar, then the VLM at `vlm` (if set). `caption` always
    returns a `Caption`: source ``none`` and empty text when nothing captions the clip. A sidecar
    that cannot be used is passed over (the VLM, if any, is asked) and named in ``problem``."""

    def __init__(self, vlm: str | os.PathLike[str] | None = None) -> None:
        self.sidecar = SidecarCaptioner()
        self.vlm = VLMCaptioner(vlm) if vlm else None

    @property
    def needs_frames(self) -> bool:
        """Whether `caption` looks at the frames (only a VLM does)."""
        return self.vlm is not None

    def setup(self) -> None:
        if self.vlm is not None:
            self.vlm.setup()

    def caption(
        self, *, source_uri: str, start_s: float, end_s: float, frames: np.ndarray
    ) -> Caption:
        kw: dict[str, Any] = dict(source_uri=source_uri, start_s=start_s, end_s=end_s)
        kw["frames"] = frames
        problem = None
        try:
            cap = self.sidecar.caption(**kw)
        except SidecarError as e:
            cap, problem = None, str(e)
        if (cap is None or not cap.text) and self.vlm is not None:
            cap = self.vlm.caption(**kw)
        if cap is None or not cap.text:
            return Caption(text="", source="none", problem=problem)
        return Caption(text=cap.text, source=cap.source, problem=problem)
