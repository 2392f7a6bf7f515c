"""The typed items that flow between curation stages, and their JSON form for executors.

    VideoRef --probe--> ProbedVideo --split--> SplitVideo --stitch--> SpanTask (one per span)
             --transcode--> ClipTask --annotate/filter--> AnnotatedClip

Any stage may emit a `RejectRow` instead of its output; later stages pass rejects through. The
stitch stage also emits one `RejectRow` per range the splitter dropped (short shot, transition,
black), so a video's clips and rejects together cover its whole duration. Every final item
(AnnotatedClip or RejectRow) carries `n_parts`, the number of final items its video yields, so a
streaming consumer knows when a video is complete (resumability).

Items are plain dataclasses of JSON types; `to_json` / `from_json` move them across process
boundaries (Ray actors) without pickle.
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from dataclasses import dataclass, field
from typing import Any

from vfm_core.video.io import VideoInfo
from vfm_core.video.spans import DroppedSpan, Span


@dataclass(kw_only=True, slots=True)
class VideoRef:
    """An input video as discovered."""

    source_uri: str
    """The input as given under SRC (manifests carry this)."""
    url: str
    """Where to read it: an absolute local path or an s3:// URL."""


@dataclass(kw_only=True, slots=True, frozen=True)
class ProbedVideo(VideoInfo):
    """A readable video: `probe`'s `VideoInfo` fields plus where it is and its content hash.

    A `VideoManifest` row is these fields less `local_path`, `url` and `has_video` (always True).
    """

    source_uri: str
    """The input as given under SRC."""
    video_id: str
    """Content hash of the file (sha256, 16 hex digits)."""
    local_path: str
    """A local copy (the file itself when local; a cached download for s3://)."""
    url: str
    """Where it was read: an absolute local path or an s3:// URL."""
    size_bytes: int
    """File size."""

    def manifest_row(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        head = {k: d.pop(k) for k in ("source_uri", "video_id", "size_bytes")}
        for k in ("local_path", "url", "has_video"):
            d.pop(k)
        return head | d


@dataclass(kw_only=True, slots=True)
class SplitVideo:
    """A video and its clip candidates before stitching."""

    video: ProbedVideo
    spans: list[Span] = field(default_factory=list)
    dropped: list[DroppedSpan] = field(default_factory=list)
    """Ranges in no span, with the reason (each becomes a reject row)."""


@dataclass(kw_only=True, slots=True)
class SpanTask:
    """One clip candidate of a video (a `ClipSpans` row)."""

    video: ProbedVideo
    span_index: int
    n_parts: int
    """Final items of this video: its clip candidates plus its dropped ranges."""
    start_frame: int
    end_frame: int
    start_s: float
    end_s: float


@dataclass(kw_only=True, slots=True)
class ClipTask:
    """A written clip (a `ClipManifest` row)."""

    span: SpanTask
    clip_id: str
    uri: str
    local_path: str
    """A local copy of the clip for annotation (the clip itself for local destinations)."""
    width: int
    height: int
    fps: float
    n_frames: int
    duration_s: float
    crop_x: int = 0
    """The source box the clip shows (upright source pixels): the picture inside black bars."""
    crop_y: int = 0
    crop_w: int = 0
    """Box width (0 in items from before crops were recorded: the whole frame)."""
    crop_h: int = 0
    blockiness: float = 0.0
    """Compression blocking of the span's source pictures (`vfm_core.video.quality`)."""
    audio: str | None = None
    """Its sound: kept, none or dropped (`vfm_core.video.choices.ClipAudio`); None in items from
    before it was recorded (clips written then have no sound)."""


@dataclass(kw_only=True, slots=True)
class AnnotatedClip:
    """An accepted clip with caption, filter scores and embedding (an `AnnotatedClips` row)."""

    clip: ClipTask
    caption: str
    caption_source: str
    motion: float
    static_frac: float
    black_frac: float
    blank_frac: float
    embedding: list[float]
    caption_problem: str | None = None
    """Why the video's sidecar was passed over (names the file), kept in the video's state and
    reported by the run; not a manifest column."""

    @property
    def source_uri(self) -> str:
        return self.clip.span.video.source_uri

    @property
    def n_parts(self) -> int:
        return self.clip.span.n_parts

    def manifest_row(self) -> dict[str, Any]:
        c, s, v = self.clip, self.clip.span, self.clip.span.video
        return {
            "clip_id": c.clip_id,
            "video_id": v.video_id,
            "source_uri": v.source_uri,
            "span_index": s.span_index,
            "start_frame": s.start_frame,
            "end_frame": s.end_frame,
            "start_s": s.start_s,
            "end_s": s.end_s,
            "uri": c.uri,
            "width": c.width,
            "height": c.height,
            "fps": c.fps,
            "n_frames": c.n_frames,
            "duration_s": c.duration_s,
            "crop_x": c.crop_x,
            "crop_y": c.crop_y,
            "crop_w": c.crop_w,
            "crop_h": c.crop_h,
            "blockiness": c.blockiness,
            "audio": c.audio,
            "caption": self.caption,
            "caption_source": self.caption_source,
            "motion": self.motion,
            "static_frac": self.static_frac,
            "black_frac": self.black_frac,
            "blank_frac": self.blank_frac,
            "embedding": self.embedding,
        }


@dataclass(kw_only=True, slots=True)
class RejectRow:
    """An input video or clip candidate that was dropped (a `Rejects` row)."""

    source_uri: str
    stage: str
    reason: str
    video_id: str | None = None
    start_s: float | None = None
    """Start of the rejected range in the source, seconds (0 for a whole video; None when the
    input could not be read as far as a stated duration)."""
    end_s: float | None = None
    """End of the rejected range (the stated duration for a whole video)."""
    n_parts: int = 1
    """Final items of this video (1 for a video-level reject, else `SpanTask.n_parts`)."""
    video: ProbedVideo | None = None
    """The probed video when the reject happened after probing (for the video manifest)."""

    def manifest_row(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d.pop("n_parts")
        d.pop("video")
        return d


Item = VideoRef | ProbedVideo | SplitVideo | SpanTask | ClipTask | AnnotatedClip | RejectRow
TYPES: dict[str, type] = {
    t.__name__: t
    for t in (
        VideoRef,
        ProbedVideo,
        SplitVideo,
        SpanTask,
        ClipTask,
        AnnotatedClip,
        RejectRow,
        Span,
        DroppedSpan,
    )
}


def to_json(item: Item) -> str:
    """{"type": name, "data": fields} as JSON."""
    return json.dumps({"type": type(item).__name__, "data": dataclasses.asdict(item)})


def _build(cls: type, data: dict[str, Any]) -> Any:
    hints = typing.get_type_hints(cls)
    kw = {}
    for f in dataclasses.fields(cls):
        if f.name not in data:
            continue
        v, hint = data[f.name], hints[f.name]
        if typing.get_origin(hint) in (typing.Union, types.UnionType):
            hint = next((a for a in typing.get_args(hint) if a is not type(None)), hint)
        if dataclasses.is_dataclass(hint) and isinstance(v, dict):
            v = _build(hint, v)  # type: ignore[arg-type]
        elif typing.get_origin(hint) is list:
            (arg,) = typing.get_args(hint)
            if dataclasses.is_dataclass(arg):
                v = [_build(arg, x) for x in v]  # type: ignore[arg-type]
        kw[f.name] = v
    return cls(**kw)


def from_json(text: str) -> Item:
    """Inverse of `to_json`."""
    obj = json.loads(text)
    cls = TYPES.get(obj.get("type", ""))
    if cls is None:
        raise ValueError(f"unknown curation item type {obj.get('type')!r}")
    return _build(cls, obj["data"])
