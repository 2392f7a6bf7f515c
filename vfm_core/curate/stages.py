"""Curation stages behind one `Stage` protocol: `setup()` once per worker, `process(batch)`.

The order (see `records` for the items):

    probe      VideoRef    -> ProbedVideo     read (download s3://), content hash, probe
    split      ProbedVideo -> SplitVideo      shot detection (colour change / stride / TransNetV2)
    stitch     SplitVideo  -> SpanTask*       merge false cuts; one item per clip candidate, and
                                              a reject per dropped range (short shot, transition)
    transcode  SpanTask    -> ClipTask        H.264 MP4 at DST/clips/{clip_id}.mp4
    annotate   ClipTask    -> AnnotatedClip   embedding, caption, filter scores (or a reject)

The per-video stages (probe, split, stitch) are here; the per-clip ones (transcode, annotate) are
in `curate.clip_stages`, and the `Stage` protocol with the base that turns every user-caused
failure into a `RejectRow` in `curate.stage_base`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
from dataclasses import dataclass, field
from typing import Any

from vfm_core import storage
from vfm_core.curate.clip_stages import AnnotateStage, TranscodeStage
from vfm_core.curate.config import CurateConfig
from vfm_core.curate.records import Item, ProbedVideo, RejectRow, SpanTask, SplitVideo, VideoRef
from vfm_core.curate.stage_base import MapStage, Stage, local_copy, local_video
from vfm_core.storage import not_regular
from vfm_core.video.container import VideoError
from vfm_core.video.io import probe
from vfm_core.video.spans import DroppedSpan, Segmentation
from vfm_core.video.stitch import stitch


def _hash_file(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()[:16]


@dataclass(kw_only=True)
class ProbeStage(MapStage):
    """VideoRef -> ProbedVideo: fetch, content hash (video_id), probe. A local input that is not
    a regular file (a FIFO named ``x.mp4`` would block the run forever) is refused unopened."""

    name = "probe"

    def one(self, item: VideoRef) -> list[Item]:
        if not storage.is_remote(item.url):
            kind = not_regular(item.url.removeprefix("file://"))
            if kind is not None:
                raise VideoError(item.source_uri, f"not a regular file ({kind}): not opened")
        local = local_copy(item.url, self.work_dir)
        info = probe(local, max_pixels=self.cfg.max_pixels)
        if info.fps <= 0:
            raise VideoError(item.source_uri, "frame rate unknown")
        return [
            ProbedVideo(
                source_uri=item.source_uri,
                video_id=_hash_file(local),
                local_path=local,
                url=item.url,
                size_bytes=os.path.getsize(local),
                **dataclasses.asdict(info),
            )
        ]


@dataclass(kw_only=True)
class SplitStage(MapStage):
    """ProbedVideo -> SplitVideo: spans plus every dropped range with its reason (or one reject
    of the whole video when no shot is long enough)."""

    name = "split"
    reject_as = "split"
    _splitter: Any = field(default=None, init=False, repr=False)

    def setup(self) -> None:
        self._splitter = self.cfg.splitter_obj()

    def one(self, item: ProbedVideo) -> list[Item]:
        if self._splitter is None:
            self.setup()
        seg = self._splitter.segment(local_video(item, self.work_dir), fps=item.fps)
        if not seg.spans:
            raise ValueError(_no_shot_reason(seg, item, self.cfg.min_len_s))
        dropped = seg.dropped + _undecoded(seg, item)
        return [SplitVideo(video=item, spans=seg.spans, dropped=dropped)]


def _no_shot_reason(seg: Segmentation, v: ProbedVideo, min_len_s: float) -> str:
    """One reason for a video without a clip candidate (its whole duration is rejected)."""
    head = f"no shot of at least {min_len_s:g} s"
    tail = f"video is {v.duration_s:.2f} s, {v.n_frames} frames"
    short = [d for d in seg.dropped if d.reason.startswith("shot ")]
    if short:
        longest = max(d.duration_s for d in short)
        n = len(short)
        return f"{head}: all {n} shot(s) shorter (longest {longest:.2f} s; {tail})"
    kinds = sorted({d.reason for d in seg.dropped})
    black = sum(d.duration_s for d in seg.dropped if d.reason.startswith("black"))
    if seg.dropped and black >= 0.9 * sum(d.duration_s for d in seg.dropped):
        return f"entirely black: no picture ({tail}; {', '.join(kinds)})"
    return f"{head} ({tail}; {', '.join(kinds) or 'no frames'})"


def _undecoded(seg: Segmentation, v: ProbedVideo) -> list[DroppedSpan]:
    """Ranges of the stated duration with no decoded frame (before the first or after the last;
    more than two frames), so they are accounted for too."""
    parts = [*seg.spans, *seg.dropped]
    first = min(p.start_s for p in parts)
    last = max(p.end_s for p in parts)
    tol = 2.0 / v.fps
    out = []
    if first > tol:
        why = f"no decoded frame before {first:.2f} s"
        out.append(DroppedSpan(start_frame=0, end_frame=0, start_s=0.0, end_s=first, reason=why))
    if v.duration_s - last > tol:
        why = f"no decoded frame after {last:.2f} s (the stream states {v.duration_s:.2f} s)"
        n = seg.n_frames
        out.append(
            DroppedSpan(start_frame=n, end_frame=n, start_s=last, end_s=v.duration_s, reason=why)
        )
    return out


@dataclass(kw_only=True)
class StitchStage(MapStage):
    """SplitVideo -> one SpanTask per clip candidate, after merging false cuts, and one reject per
    dropped range. Short shots are not merged into a neighbour: each is a reject with its length.
    """

    name = "stitch"
    reject_as = "split"

    def one(self, item: SplitVideo) -> list[Item]:
        spans = item.spans
        if self.cfg.stitches() and len(spans) > 1:
            v = item.video
            max_f = None if self.cfg.max_len_s is None else int(self.cfg.max_len_s * v.fps + 1e-6)
            spans = stitch(
                spans,
                local_video(v, self.work_dir),
                threshold=self.cfg.stitch_threshold,
                max_frames=max_f,
                width=self.cfg.analysis_width,
            )
        v, n_parts = item.video, len(spans) + len(item.dropped)
        tasks: list[Item] = [
            SpanTask(
                video=v,
                span_index=i,
                n_parts=n_parts,
                start_frame=s.start_frame,
                end_frame=s.end_frame,
                start_s=s.start_s,
                end_s=s.end_s,
            )
            for i, s in enumerate(spans)
        ]
        rejects: list[Item] = [
            RejectRow(
                source_uri=v.source_uri,
                video_id=v.video_id,
                stage="split",
                reason=d.reason,
                start_s=d.start_s,
                end_s=d.end_s,
                n_parts=n_parts,
                video=v,
            )
            for d in item.dropped
        ]
        return tasks + rejects


def build_stages(cfg: CurateConfig, *, dst: str, work_dir: str) -> list[Stage]:
    """probe -> split -> stitch -> transcode -> annotate, sharing one config."""
    kw = dict(cfg=cfg, dst=dst, work_dir=work_dir)
    return [
        ProbeStage(**kw),
        SplitStage(**kw),
        StitchStage(**kw),
        TranscodeStage(**kw),
        AnnotateStage(**kw),
    ]  # type: ignore[list-item]
