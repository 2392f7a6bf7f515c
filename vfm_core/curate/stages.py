"""Curation stages behind one `Stage` protocol: `setup()` once per worker, `process(batch)`.

The order (see `records` for the items):

    probe      VideoRef    -> ProbedVideo     read (download s3://), content hash, probe
    split      ProbedVideo -> SplitVideo      shot detection (colour change / stride / TransNetV2)
    stitch     SplitVideo  -> SpanTask*       merge false cuts; one item per clip candidate, and
                                              a reject per dropped range (short shot, transition)
    transcode  SpanTask    -> ClipTask        H.264 MP4 at DST/clips/{clip_id}.mp4
    annotate   ClipTask    -> AnnotatedClip   embedding, caption, filter scores (or a reject)

A stage turns every user-caused failure (bad file, unreadable object, undecodable span, a path
that is no regular file such as a FIFO, a decode past `video.io.DECODE_TIMEOUT`) into a
`RejectRow` with its stage and reason; rejects from earlier stages pass through unchanged, so
every input ends as accepted clips or rejects, and every second of a probed video is in exactly
one clip or reject row (`vfm_core.curate.coverage`). A storage failure after the input was read
(e.g. uploading a clip) is not the input's fault: it raises, and the resumable run is retried.
Stages are plain picklable objects: the same instances run in-process or inside Ray actors.
"""

from __future__ import annotations

import dataclasses
import errno
import hashlib
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import av
import numpy as np

from vfm_core import storage
from vfm_core.annotate.caption import Caption, CurateCaptioner
from vfm_core.annotate.embed import ColorThumbEmbedder, Embedder, HFImageEmbedder, clip_embedding
from vfm_core.annotate.filters import reject_reasons, sample_indices, score_frames
from vfm_core.curate.config import CurateConfig
from vfm_core.curate.records import (
    AnnotatedClip,
    ClipTask,
    Item,
    ProbedVideo,
    RejectRow,
    SpanTask,
    SplitVideo,
    VideoRef,
)
from vfm_core.video.io import VideoError, decode_frames, not_regular, probe
from vfm_core.video.quality import PictureReport, inspect_span
from vfm_core.video.shots import DroppedSpan, Segmentation
from vfm_core.video.stitch import stitch
from vfm_core.video.transcode import select_encoder, transcode_span

_USER_ERRORS = (VideoError, storage.StorageError, OSError, ValueError, av.FFmpegError)
_DISK_FULL = (errno.ENOSPC, errno.EDQUOT)


@runtime_checkable
class Stage(Protocol):
    """One step of the pipeline: `setup()` once per worker, then `process(batch)` many times."""

    name: str

    def setup(self) -> None: ...

    def process(self, batch: list[Item]) -> list[Item]: ...


def clip_id_of(video_id: str, start_frame: int, end_frame: int, settings: str) -> str:
    """hash(video, span, settings): the same clip always gets the same id (no duplicates)."""
    key = f"{video_id}:{start_frame}:{end_frame}:{settings}".encode()
    return hashlib.sha256(key).hexdigest()[:16]


def _hash_file(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()[:16]


@dataclass(kw_only=True)
class _MapStage:
    """A stage that maps each non-reject item to a list of items; user errors become rejects."""

    cfg: CurateConfig
    """Curation settings."""
    dst: str
    """Destination root (local path or s3:// URL)."""
    work_dir: str
    """Local scratch directory (downloads of s3:// inputs, clips before upload)."""
    name = "stage"
    reject_as = "probe"

    def setup(self) -> None:
        return None

    def process(self, batch: list[Item]) -> list[Item]:
        out: list[Item] = []
        for item in batch:
            if isinstance(item, RejectRow):
                out.append(item)
                continue
            try:
                out += self.one(item)
            except storage.StorageError as e:
                if self.name != "probe":
                    raise  # the store failed, not the input: fail the run (retry/resume)
                out.append(self._reject(item, e))
            except _USER_ERRORS as e:
                if getattr(e, "errno", None) in _DISK_FULL:  # the store, not the video: fail
                    # the run; the video gets no finished state and is curated on the next run
                    raise storage.StorageError(self.dst, f"disk full ({e})") from None
                out.append(self._reject(item, e))
        return out

    def one(self, item: Any) -> list[Item]:
        raise NotImplementedError

    def _reject(self, item: Any, e: BaseException) -> RejectRow:
        reason = e.reason if isinstance(e, VideoError | storage.StorageError) else str(e)
        reason = reason or type(e).__name__
        stage = "read" if isinstance(e, storage.StorageError) else self.reject_as
        if isinstance(item, VideoRef):
            return RejectRow(source_uri=item.source_uri, stage=stage, reason=reason)
        video = item.video if isinstance(item, SplitVideo | SpanTask) else None
        span = item.span if isinstance(item, ClipTask) else None
        span = item if isinstance(item, SpanTask) else span
        video = span.video if span is not None else video if video is not None else item
        return RejectRow(
            source_uri=video.source_uri,
            video_id=video.video_id,
            stage=stage,
            reason=reason,
            start_s=span.start_s if span else 0.0,  # no span: the whole probed video
            end_s=span.end_s if span else video.duration_s,
            n_parts=span.n_parts if span else 1,
            video=video,
        )


def local_copy(url: str, work_dir: str) -> str:
    """A local path for `url`: the file itself, or a cached download of a remote object."""
    if not storage.is_remote(url):
        return url.removeprefix("file://")
    suffix = Path(url).suffix or ".bin"
    path = Path(work_dir) / "src" / (hashlib.sha256(url.encode()).hexdigest()[:20] + suffix)
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".part")
        try:
            with os.fdopen(fd, "wb") as out, storage.open_url(url, "rb") as f:
                while chunk := f.read(1 << 20):
                    out.write(chunk)
            os.replace(tmp, path)
        except BaseException as e:
            Path(tmp).unlink(missing_ok=True)
            if isinstance(e, OSError) and not isinstance(e, storage.StorageError):
                raise storage.StorageError(url, f"unreadable ({e})") from None
            raise
    return str(path)


@dataclass(kw_only=True)
class ProbeStage(_MapStage):
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


def _local_video(v: ProbedVideo, work_dir: str) -> str:
    """The video's local copy (re-fetched when this worker does not share the prober's disk)."""
    return v.local_path if os.path.exists(v.local_path) else local_copy(v.url, work_dir)


@dataclass(kw_only=True)
class SplitStage(_MapStage):
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
        seg = self._splitter.segment(_local_video(item, self.work_dir), fps=item.fps)
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
class StitchStage(_MapStage):
    """SplitVideo -> one SpanTask per clip candidate, after merging false cuts, and one reject per
    dropped range. Short shots are not merged into a neighbour: each is a reject with its length.
    """

    name = "stitch"
    reject_as = "split"

    def one(self, item: SplitVideo) -> list[Item]:
        spans = item.spans
        if self.cfg.stitch and len(spans) > 1:
            v = item.video
            max_f = None if self.cfg.max_len_s is None else int(self.cfg.max_len_s * v.fps + 1e-6)
            spans = stitch(
                spans,
                _local_video(v, self.work_dir),
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


@dataclass(kw_only=True)
class TranscodeStage(_MapStage):
    """SpanTask -> ClipTask: H.264 MP4 at DST/clips/{clip_id}.mp4 (keyframe first)."""

    name = "transcode"
    reject_as = "transcode"
    _encoder: str | None = field(default=None, init=False, repr=False)

    def setup(self) -> None:
        # once per worker; an unusable encoder setting fails the run (EncoderError), not a clip
        self._encoder = select_encoder(self.cfg.encoder, setting="CurateConfig.encoder")

    def one(self, item: SpanTask) -> list[Item]:
        if self._encoder is None:
            self.setup()
        v, cfg = item.video, self.cfg
        src = _local_video(v, self.work_dir)
        look = self._inspect(item, src)
        unfit = unfit_reason(look, cfg)
        if unfit is not None:  # decided before encoding: no work spent on the span
            return [_span_reject(item, stage="filter", reason=unfit)]
        up_w, up_h = (v.height, v.width) if (v.rotation // 90) % 2 else (v.width, v.height)
        crop = look.crop if look is not None else None
        box = None if crop is None or crop.is_full(up_w, up_h) else crop
        cid = clip_id_of(v.video_id, item.start_frame, item.end_frame, cfg.clip_settings())
        uri = storage.join(self.dst, "clips", f"{cid}.mp4")
        remote = storage.is_remote(uri)
        final = Path(self.work_dir) / "clips" / f"{cid}.mp4" if remote else Path(uri)
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = final.with_name(f".{cid}.{os.getpid()}.part.mp4")
        try:
            r = transcode_span(
                src,
                tmp,
                item.start_s,
                item.end_s,
                width=cfg.out_width,
                fps=cfg.out_fps or (v.fps if v.vfr else None),
                cfr=v.vfr,
                rotation=v.rotation,
                crf=cfg.crf,
                preset=cfg.preset,
                encoder=self._encoder,
                crop=None if box is None else (box.x, box.y, box.w, box.h),
            )
            os.replace(tmp, final)
        finally:
            tmp.unlink(missing_ok=True)
        if remote:
            try:
                storage.put_file(final, uri)
            except OSError as e:
                raise storage.StorageError(uri, f"upload failed ({e})") from None
        return [
            ClipTask(
                span=item,
                clip_id=cid,
                uri=uri,
                local_path=str(final),
                width=r.width,
                height=r.height,
                fps=r.fps,
                n_frames=r.n_frames,
                duration_s=r.duration_s,
                crop_x=crop.x if crop else 0,
                crop_y=crop.y if crop else 0,
                crop_w=crop.w if crop else up_w,
                crop_h=crop.h if crop else up_h,
                blockiness=look.blockiness if look is not None else 0.0,
            )
        ]

    def _inspect(self, item: SpanTask, src: str) -> PictureReport | None:
        """Bars and blockiness of the span's source pictures (None when both are off)."""
        pic, v = self.cfg.picture, item.video
        if not pic.enabled:
            return None
        return inspect_span(
            src,
            item.start_s,
            item.end_s,
            n_frames=item.end_frame - item.start_frame,
            width=v.width,
            height=v.height,
            rotation=v.rotation,
            cfg=pic,
        )


def unfit_reason(look: PictureReport | None, cfg: CurateConfig) -> str | None:
    """Why a span is not fit for training before it is encoded (None: fit): no picture inside
    black bars, a picture inside them below the filters' minimum size, or blocky compression."""
    if look is None:
        return None
    pic, f = cfg.picture, cfg.filters
    n = pic.sample_frames
    if look.crop is None:
        return (
            f"entirely black bars: no picture (every line of {n} sampled frames dark, flat and "
            f"still: mean luma <= bar_level={pic.bar_level:g}, std <= bar_std={pic.bar_std:g})"
        )
    c = look.crop
    if c.w < f.min_width or c.h < f.min_height:
        return (
            f"picture inside black bars {c.w}x{c.h} at ({c.x}, {c.y}) below minimum "
            f"{f.min_width}x{f.min_height}"
        )
    if pic.max_blockiness is not None and look.blockiness > pic.max_blockiness:
        return (
            f"blocky: compression blockiness {look.blockiness:.2f} above max_blockiness="
            f"{pic.max_blockiness:g} (excess luma step on the 8x8 block grid, {n} sampled frames)"
        )
    return None


def _span_reject(item: SpanTask, *, stage: str, reason: str) -> RejectRow:
    v = item.video
    return RejectRow(
        source_uri=v.source_uri,
        video_id=v.video_id,
        stage=stage,
        reason=reason,
        start_s=item.start_s,
        end_s=item.end_s,
        n_parts=item.n_parts,
        video=v,
    )


@dataclass(kw_only=True)
class AnnotateStage(_MapStage):
    """ClipTask -> AnnotatedClip (embedding, caption, scores) or a filter reject."""

    name = "annotate"
    reject_as = "annotate"
    _embedder: Any = field(default=None, init=False, repr=False)
    _captioner: Any = field(default=None, init=False, repr=False)

    def setup(self) -> None:
        cfg = self.cfg
        self._embedder: Embedder = (
            HFImageEmbedder(cfg.image_model) if cfg.image_model else ColorThumbEmbedder()
        )
        self._captioner = CurateCaptioner(cfg.vlm)
        self._captioner.setup()

    def one(self, item: ClipTask) -> list[Item]:
        if self._embedder is None:
            self.setup()
        cfg, span = self.cfg, item.span
        path = (
            item.local_path
            if os.path.exists(item.local_path)
            else local_copy(item.uri, self.work_dir)
        )
        frames = decode_frames(path, width=cfg.analysis_width)  # (T, h, w, 3)
        sampled = frames[sample_indices(len(frames), item.fps, cfg.filters.sample_fps)]
        scores = score_frames(sampled, cfg.filters)
        reasons = reject_reasons(
            scores,
            width=item.width,
            height=item.height,
            duration_s=item.duration_s,
            cfg=cfg.filters,
        )
        times = dict(start_s=span.start_s, end_s=span.end_s, duration_s=item.duration_s)
        cap = caption_clip(self._captioner, span.video.url, times | {"fps": item.fps}, path)
        if cap.source == "none" and cfg.require_caption:
            reasons.append(no_caption_reason(cap))
        if reasons:
            remove_clip(item.uri)
            return [
                RejectRow(
                    source_uri=span.video.source_uri,
                    video_id=span.video.video_id,
                    stage="filter",
                    reason="; ".join(reasons),
                    start_s=span.start_s,
                    end_s=span.end_s,
                    n_parts=span.n_parts,
                    video=span.video,
                )
            ]
        emb = clip_embedding(self._embedder, sampled, n=cfg.embed_frames)
        return [
            AnnotatedClip(
                clip=item,
                caption=cap.text,
                caption_source=cap.source,
                caption_problem=cap.problem,
                motion=scores.motion,
                static_frac=scores.static_frac,
                black_frac=scores.black_frac,
                blank_frac=scores.blank_frac,
                embedding=[float(x) for x in np.asarray(emb, np.float32)],
            )
        ]


def caption_clip(
    captioner: CurateCaptioner, video_url: str, clip: dict[str, Any], clip_path: str
) -> Caption:
    """Caption of a clip (its `start_s`, `end_s` in the video at `video_url`, whose sidecar is
    beside it; its `duration_s`, `fps`): a VLM sees the middle frame of `clip_path` at full size.
    """
    frames = np.zeros((0, 1, 1, 3), np.uint8)  # (0, H, W, 3): a sidecar needs no frames
    if captioner.needs_frames:
        mid = clip["duration_s"] / 2
        end = mid + 1.0 / clip["fps"]
        frames = decode_frames(clip_path, start_s=mid, end_s=end)  # (1, H, W, 3)
    return captioner.caption(
        source_uri=video_url, start_s=clip["start_s"], end_s=clip["end_s"], frames=frames
    )


def no_caption_reason(cap: Caption) -> str:
    """The filter reason of a clip without a caption when captions are required."""
    why = f": {cap.problem}" if cap.problem else ""
    return f"no caption (sidecar or VLM){why}"


def remove_clip(uri: str) -> None:
    """Delete a rejected clip so DST/clips holds exactly the accepted clips."""
    fs, path = storage.filesystem(uri)
    if fs.exists(path):
        fs.rm(path)


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
