"""`CurateConfig`: the settings of every curation stage, JSON-able for Prefect parameters.

Its field defaults are the one set of curation defaults: `vfm curate` (CLI) and the curation
flow's form take theirs from here; a caller that wants other values (the demo pipeline's short
clips) passes them as named parameters.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

from vfm_core.annotate.filters import FilterConfig
from vfm_core.config import build_settings
from vfm_core.config_fields import out_of_bounds
from vfm_core.curate.options import CurateOptions
from vfm_core.curate.semdedup import SemDedupConfig
from vfm_core.video.choices import AUDIO_MODES, PRESETS, SPLITTERS
from vfm_core.video.hybrid_splitter import HybridSplitter
from vfm_core.video.io import MAX_PIXELS
from vfm_core.video.quality import PictureConfig
from vfm_core.video.shots import ColorChangeSplitter, FixedStrideSplitter, Splitter
from vfm_core.video.spans import LengthRules
from vfm_core.video.transnet import TransNetV2Splitter

_ROWS = 2
"""What a finished video's state holds, in the settings hash so older states are redone:
2 = reject rows for every dropped range (short shot, transition, black), with start / end."""

_CAPTIONS = 2
"""How captions are chosen, in `caption_settings` so older captions are redone (recaptioned, the
clips are kept): 2 = a sidecar segment captions a clip only when it covers > 50 % of it, and
``caption_source`` tells segment from sidecar."""


@dataclass(kw_only=True, slots=True)
class CurateConfig(CurateOptions):
    """Settings of every curation stage: the scalar ones (:class:`~vfm_core.curate.options.
    CurateOptions`, the fields ``vfm curate`` and the curation flow's form are generated from)
    and these."""

    max_pixels: int = MAX_PIXELS
    """Videos declaring a larger frame (width x height) are rejected."""
    filters: FilterConfig = field(default_factory=FilterConfig)
    """Filter thresholds."""
    picture: PictureConfig = field(default_factory=PictureConfig)
    """Black-bar crop and the blockiness filter, decided per span before it is encoded."""
    semdedup: SemDedupConfig = field(default_factory=SemDedupConfig)
    """Near-duplicate removal over the clip embeddings when the manifests are assembled (off by
    default); changing it re-assembles, it never re-curates a video."""

    def __post_init__(self) -> None:
        """Settings outside their bounds, and settings that would reject every clip, are
        errors, not a run of rejects."""
        if problem := out_of_bounds(self):
            raise ValueError(problem)
        for name, allowed in (("audio", AUDIO_MODES), ("preset", PRESETS)):
            if getattr(self, name) not in allowed:
                raise ValueError(
                    f"{name}={getattr(self, name)!r} (--{name}): expected one of "
                    f"{', '.join(allowed)}"
                )
        if self.max_len_s is not None and self.max_len_s < self.min_len_s:
            raise ValueError(
                f"max_len_s={self.max_len_s} (--max-len) is below min_len_s={self.min_len_s} "
                "(--min-len): every window of a longer shot would be a reject"
            )
        if self.splitter == "stride" and self.stride_s < self.min_len_s:
            raise ValueError(
                f"stride_s={self.stride_s} is below min_len_s={self.min_len_s} (--min-len): "
                "every window of the stride splitter would be a reject"
            )
        f = self.filters
        if self.out_width is not None and self.out_width < f.min_width:
            raise ValueError(
                f"out_width={self.out_width} (--width) is below the filters' min_width="
                f"{f.min_width}: every clip would be rejected as too small"
            )

    def _settings(self) -> dict[str, Any]:
        """The fields as a dict, ``audio`` left out when it is drop: clips without sound are
        what curation wrote before the setting existed, so those clip ids and finished videos
        stay valid under ``--audio drop`` (under keep they are curated again, with sound)."""
        d = dataclasses.asdict(self)
        if d["audio"] == "drop":
            d.pop("audio")
        return d

    def clip_settings(self) -> str:
        """Everything that changes which clips are written and what they contain (for clip ids)."""
        d = self._settings()
        for k in ("filters", "embed_frames", "image_model", "vlm", "require_caption", "semdedup"):
            d.pop(k)
        d["picture"].pop("max_blockiness")  # a filter: it never changes a written clip
        return json.dumps(d, sort_keys=True)

    def settings_hash(self) -> str:
        """Hash of the per-video settings (a finished video is redone when this changes). The
        assembly-time ``semdedup`` is not one of them, nor the captioner (`caption_settings`:
        a finished video is recaptioned, its clips kept, when that changes)."""
        d = self._settings()
        d.pop("semdedup")
        d.pop("vlm")
        text = json.dumps(d | {"_rows": _ROWS}, sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def legacy_settings_hash(self) -> str:
        """`settings_hash` as it was while the captioner was one of the settings (states written
        then are still finished videos; they are recaptioned, not curated again)."""
        d = self._settings()
        d.pop("semdedup")
        text = json.dumps(d | {"_rows": _ROWS}, sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def caption_settings(self) -> str:
        """What chooses a clip's caption (the VLM and the caption rules); a finished video whose
        captions were made otherwise is recaptioned."""
        return json.dumps({"vlm": self.vlm, "_captions": _CAPTIONS}, sort_keys=True)

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form (Prefect parameters, task arguments)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> CurateConfig:
        """Inverse of `to_dict`, through the run config's builder (:func:`~vfm_core.config.
        build_settings`): an unknown key or a wrong type is one ConfigError naming
        ``curate.<section>.<key>``."""
        return build_settings(cls, d, prefix="curate")

    def stitches(self) -> bool:
        """Whether the stitch stage merges spans (``stitch``, None resolved by the splitter)."""
        return self.splitter != "hybrid" if self.stitch is None else self.stitch

    def lengths(self) -> LengthRules:
        """The clip length rules (``min_len_s``, ``max_len_s``)."""
        return LengthRules(min_len_s=self.min_len_s, max_len_s=self.max_len_s)

    def splitter_obj(self) -> Splitter:
        lengths = self.lengths()
        if self.splitter == "hybrid":
            color = ColorChangeSplitter(analysis_width=self.analysis_width)
            return HybridSplitter(color=color, lengths=lengths)
        if self.splitter == "color":
            return ColorChangeSplitter(analysis_width=self.analysis_width, lengths=lengths)
        if self.splitter == "stride":
            return FixedStrideSplitter(stride_s=self.stride_s, lengths=lengths)
        if self.splitter == "transnetv2":
            return TransNetV2Splitter(lengths=lengths)
        raise ValueError(
            f"CurateConfig.splitter: unknown {self.splitter!r}; expected one of {SPLITTERS}"
        )
