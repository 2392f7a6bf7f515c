"""Curation stages behind one `Stage` protocol: `setup()` once per worker, `process(batch)`.

The order (see `records` for the items):

    probe      VideoRef    -> ProbedVideo     read (download s3://), content hash, probe
    split      ProbedVideo -> SplitVideo      shot detection (colour change / stride / TransNetV2)
                                              over the frames that decode; a lost tail (truncated
                                              or damaged file) is one dropped range
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
from vfm_core.curate.stage_base import MapStage, Stage, local_copy, local_video, video_progress
from vfm_core.storage import not_regular
from vfm_core.video.container import VideoError
from vfm_core.video.io import collect_gaps, lost_tail, observe_decode, probe
from vfm_core.video.spans import DroppedSpan, Segmentation, cut_at_gaps
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
    a regular file (a FIFO named ``x.mp4`` would block the run forever) is refused unopened. A
    truncated file whose first frame decodes passes (its decodable prefix is curated, the split
    stage rejects its lost tail); one where nothing decodes is a reject of its stated seconds."""

    name = "probe"

    def one(self, item: VideoRef) -> list[Item]:
        if not storage.is_remote(item.url):
            kind = not_regular(item.url.removeprefix("file://"))
            if kind is not None:
                raise VideoError(item.source_uri, f"not a regular file ({kind}): not opened")
        local = local_copy(item.url, self.work_dir)
        info = probe(local, max_pixels=self.cfg.max_pixels, allow_truncated=True)
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
        src = local_video(item, self.work_dir)
        with video_progress("split", item) as bar, observe_decode(bar.at), collect_gaps() as gaps:
            seg = self._splitter.segment(src, fps=item.fps)
        if gaps:  # breaks inside the stream (damage, a size switch, joined recordings)
            seg = cut_at_gaps(seg, gaps, self.cfg.lengths())
        lost = _lost_tail(seg, item, src)
        if not seg.spans and lost is None:
            raise ValueError(_no_shot_reason(seg, item, self.cfg.min_len_s))
        if not seg.spans:  # the decodable prefix is one reject, its lost tail another
            why = _no_shot_reason(seg, item, self.cfg.min_len_s, decoded_s=lost.start_s)
            head = DroppedSpan(
                start_frame=0, end_frame=seg.n_frames, start_s=0.0, end_s=lost.start_s, reason=why
            )
            return [SplitVideo(video=item, spans=[], dropped=[head, lost])]
        dropped = seg.dropped + _undecoded(seg, item, lost)
        return [SplitVideo(video=item, spans=seg.spans, dropped=dropped)]


def _no_shot_reason(
    seg: Segmentation, v: ProbedVideo, min_len_s: float, *, decoded_s: float | None = None
) -> str:
    """One reason for a video without a clip candidate (its whole duration is rejected, or its
    first `decoded_s` seconds when the rest is lost)."""
    head = f"no shot of at least {min_len_s:g} s"
    tail = f"video is {v.duration_s:.2f} s, {v.n_frames} frames"
    if decoded_s is not None:
        n, dur = seg.n_frames, v.duration_s
        tail = f"{decoded_s:.2f} s, {n} frames decode of the video's {dur:.2f} s"
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


def _decoded_range(seg: Segmentation) -> tuple[float, float]:
    """Seconds from the first decoded frame to the end of the last one."""
    parts = [*seg.spans, *seg.dropped]
    return min(p.start_s for p in parts), max(p.end_s for p in parts)


def _lost_tail(seg: Segmentation, v: ProbedVideo, src: str) -> DroppedSpan | None:
    """The stated seconds after the last decoded frame when the file says why they are lost
    (truncated, or the decoder fails there: `lost_tail`), as one dropped range; None when
    nothing is missing (more than two frames) or no cause shows."""
    last = _decoded_range(seg)[1] if seg.spans or seg.dropped else 0.0
    if v.duration_s - last <= 2.0 / v.fps:
        return None
    try:
        cause = lost_tail(src, after_s=last)
    except VideoError:  # the look for the cause failed: the tail keeps the plain reason
        return None
    if cause is None:
        return None
    why = (
        f"{cause} (lost tail: no decoded frame after {last:.2f} s of the {v.duration_s:.2f} s "
        "the stream states)"
    )
    n = seg.n_frames
    return DroppedSpan(start_frame=n, end_frame=n, start_s=last, end_s=v.duration_s, reason=why)


def _undecoded(seg: Segmentation, v: ProbedVideo, lost: DroppedSpan | None) -> list[DroppedSpan]:
    """Ranges of the stated duration with no decoded frame (before the first or after the last;
    more than two frames), so they are accounted for too: the tail is `lost` when its cause is
    known."""
    first, last = _decoded_range(seg)
    tol = 2.0 / v.fps
    out = []
    if first > tol:
        why = f"no decoded frame before {first:.2f} s"
        out.append(DroppedSpan(start_frame=0, end_frame=0, start_s=0.0, end_s=first, reason=why))
    if lost is not None:
        out.append(lost)
    elif v.duration_s - last > tol:
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
