"""The per-clip curation stages: `TranscodeStage` (SpanTask -> ClipTask: the span's picture
checked for black bars and blockiness, then encoded as H.264 MP4, with the span's sound as AAC
unless ``audio`` is drop) and `AnnotateStage` (ClipTask -> AnnotatedClip: embedding, caption,
filter scores, or a reject), with the caption helpers `curate.recaption` shares, and the commit
of a video's clips.

A blocky span is rejected before it is encoded unless it does not move: a frozen shot repeats
the frame coded just after its cut, whose blocking then scores for the whole shot. Such a span
is encoded and the filters judge its clip like any other; a clip without motion is rejected for
that ("static: ..."), a moving one as blocky.

A clip is encoded to DST/_pending/{clip_id}.mp4 and only moved to its final name
DST/clips/{clip_id}.mp4 (`commit_clips`, one rename each) when its video is finished and its
state is about to be written; so an interrupted run (Ctrl-C, a kill, a full disk) leaves its
clips in DST/_pending, never in DST/clips, and `discard_pending` (at the start and end of every
run and on failure) deletes them: DST/clips holds no clip that no state names.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import av
import numpy as np

from vfm_core import storage
from vfm_core.annotate.caption import Caption, CurateCaptioner
from vfm_core.annotate.embed import ColorThumbEmbedder, Embedder, HFImageEmbedder, clip_embedding
from vfm_core.annotate.filters import (
    motion_reason,
    reject_reasons,
    sample_step,
    score_frames,
)
from vfm_core.curate.config import CurateConfig
from vfm_core.curate.records import (
    AnnotatedClip,
    ClipTask,
    Item,
    ProbedVideo,
    RejectRow,
    SpanTask,
)
from vfm_core.curate.stage_base import MapStage, local_copy, local_video, video_progress
from vfm_core.progress import MediaProgress
from vfm_core.video.io import decode_frames, iter_av_frames, observe_decode
from vfm_core.video.quality import PictureReport, inspect_span
from vfm_core.video.transcode import select_encoder, transcode_span


def clip_id_of(video_id: str, start_frame: int, end_frame: int, settings: str) -> str:
    """hash(video, span, settings): the same clip always gets the same id (no duplicates)."""
    key = f"{video_id}:{start_frame}:{end_frame}:{settings}".encode()
    return hashlib.sha256(key).hexdigest()[:16]


log = logging.getLogger(__name__)

PENDING = "_pending"
"""Under DST: clips encoded but not committed (their video not finished yet)."""


def clip_uri(dst: str, clip_id: str) -> str:
    """Where a committed clip lives (the uri its manifest row names)."""
    return storage.join(dst, "clips", f"{clip_id}.mp4")


def pending_uri(dst: str, clip_id: str) -> str:
    """Where a clip waits, once encoded, until its video is committed."""
    return storage.join(dst, PENDING, f"{clip_id}.mp4")


def commit_clips(dst: str, clip_ids: list[str]) -> None:
    """Move the clips' pending files to their final names (a rename each: atomic on a local
    disk; copy + delete on an object store). A clip with no pending file was committed before
    (a rerun of a state that was lost after the rename) or is a rejected clip: nothing to do."""
    fs, _ = storage.filesystem(dst)
    for cid in clip_ids:
        src, final = pending_uri(dst, cid), clip_uri(dst, cid)
        _, src_path = storage.filesystem(src)
        _, final_path = storage.filesystem(final)
        if storage.is_remote(dst):
            if fs.exists(src_path):
                fs.mv(src_path, final_path)
            continue
        Path(final_path).parent.mkdir(parents=True, exist_ok=True)
        try:
            os.replace(src_path, final_path)
        except FileNotFoundError:
            pass


def remove_clips(dst: str, clip_ids: list[str]) -> None:
    """Delete committed clips (those of a video curated again under other settings, replaced
    by its new clips), logging how many."""
    fs, _ = storage.filesystem(dst)
    for cid in clip_ids:
        _, path = storage.filesystem(clip_uri(dst, cid))
        if fs.exists(path):
            fs.rm(path)
    if clip_ids:
        log.info("%s: removed %d clip(s) of earlier settings", dst, len(clip_ids))


def discard_pending(dst: str) -> int:
    """Delete every uncommitted clip under DST/_pending (the clips of videos an interrupted or
    failed run did not finish, and those of rejects); returns how many. One run per DST at a
    time: a concurrent run's pending clips would be deleted too."""
    url = storage.join(dst, PENDING)
    fs, path = storage.filesystem(url)
    if not fs.exists(path):
        return 0
    files = storage.list_files(url)
    for f in files:
        _, p = storage.filesystem(f)
        fs.rm(p)
    if not storage.is_remote(dst):
        shutil.rmtree(path, ignore_errors=True)  # the empty folder (and stray .part files)
    return len(files)


@dataclass(kw_only=True, slots=True)
class _VideoBar:
    """A video's transcode progress lines and how many of its spans are being transcoded."""

    bar: MediaProgress
    running: int = 0


@dataclass(kw_only=True)
class TranscodeStage(MapStage):
    """SpanTask -> ClipTask: H.264 MP4 at DST/_pending/{clip_id}.mp4 (keyframe first), moved to
    DST/clips/{clip_id}.mp4 (the ClipTask's `uri`) when its video is committed."""

    name = "transcode"
    reject_as = "transcode"
    _encoder: str | None = field(default=None, init=False, repr=False)
    _bars: dict[str, _VideoBar] = field(default_factory=dict, init=False, repr=False)
    """source_uri -> its progress lines (`_BARS_LOCK` held)."""
    _interlaced: set[str] = field(default_factory=set, init=False, repr=False)
    """Videos whose deinterlacing was logged (`_BARS_LOCK` held)."""

    def setup(self) -> None:
        # once per worker; an unusable encoder setting fails the run (EncoderError), not a clip
        self._encoder = select_encoder(self.cfg.encoder, setting="CurateConfig.encoder")

    def one(self, item: SpanTask) -> list[Item]:
        if self._encoder is None:
            self.setup()
        uri = item.video.source_uri
        bar = self._progress_of(item)
        try:
            with observe_decode(bar.at):
                return self._clip(item)
        finally:
            with _BARS_LOCK:
                self._bars[uri].running -= 1

    def _progress_of(self, item: SpanTask) -> MediaProgress:
        """The progress lines of `item`'s video: one per video, through its spans (the furthest
        second reached, where spans run side by side); a video's last line when another video's
        span starts and none of its own is running."""
        v = item.video
        with _BARS_LOCK:
            for uri in [u for u, b in self._bars.items() if not b.running and u != v.source_uri]:
                self._bars.pop(uri).bar.close()
            entry = self._bars.get(v.source_uri)
            if entry is None:
                entry = self._bars[v.source_uri] = _VideoBar(
                    bar=video_progress("transcode", v, start_s=item.start_s)
                )
            entry.running += 1
            return entry.bar

    def _clip(self, item: SpanTask) -> list[Item]:
        v, cfg = item.video, self.cfg
        src = local_video(v, self.work_dir)
        span = self._decoded(item, src)  # None: too big to hold, each step decodes it
        look = self._inspect(item, src, span)
        unfit = unfit_reason(look, cfg)
        if unfit is not None and look is not None and unfit == blocky_reason(look.blockiness, cfg):
            unfit = None if self._still(item, src) else unfit  # frozen: the filters judge it
        if unfit is not None:  # decided before encoding: no work spent on the span
            return [_span_reject(item, stage="filter", reason=unfit)]
        up_w, up_h = (v.height, v.width) if (v.rotation // 90) % 2 else (v.width, v.height)
        crop = look.crop if look is not None else None
        box = None if crop is None or crop.is_full(up_w, up_h) else crop
        cid = clip_id_of(v.video_id, item.start_frame, item.end_frame, cfg.clip_settings())
        uri, pending = clip_uri(self.dst, cid), pending_uri(self.dst, cid)
        remote = storage.is_remote(uri)
        final = Path(self.work_dir) / "clips" / f"{cid}.mp4" if remote else Path(pending)
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
                audio=cfg.audio,
                frames=span,
            )
            os.replace(tmp, final)
        finally:
            tmp.unlink(missing_ok=True)
        if r.deinterlaced:
            self._note_interlaced(v)
        if remote:
            try:
                storage.put_file(final, pending)
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
                audio=r.audio,
            )
        ]

    def _note_interlaced(self, v: ProbedVideo) -> None:
        """Say once per video that its interlaced frames are made progressive."""
        with _BARS_LOCK:
            if v.source_uri in self._interlaced:
                return
            self._interlaced.add(v.source_uri)
        log.info("%s: interlaced: clips deinterlaced (FFmpeg bwdif)", v.source_uri)

    def _still(self, item: SpanTask, src: str) -> bool:
        """Whether the span's source frames fail the filters' motion check (static or low
        motion), scored as `AnnotateStage` scores a clip (analysis size, ``sample_fps``)."""
        f, w = self.cfg.filters, self.cfg.analysis_width
        step = sample_step(item.video.fps, f.sample_fps)
        sampled = decode_frames(  # (T, h, w, 3): frames[sample_indices(T, fps, sample_fps)]
            src, width=w, start_s=item.start_s, end_s=item.end_s, every=step
        )
        return motion_reason(score_frames(sampled, f), f) is not None

    def _decoded(self, item: SpanTask, src: str) -> list[tuple[float, av.VideoFrame]] | None:
        """The span's decoded frames, when the picture checks and the encoder both need them
        and they fit in `SPAN_BYTES` (one decode instead of two); else None."""
        v = item.video
        n = item.end_frame - item.start_frame + 2
        if not self.cfg.picture.enabled or n * frame_bytes(v) > SPAN_BYTES:
            return None
        return list(iter_av_frames(src, start_s=item.start_s, end_s=item.end_s, threads="AUTO"))

    def _inspect(
        self, item: SpanTask, src: str, span: list[tuple[float, av.VideoFrame]] | None
    ) -> PictureReport | None:
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
            frames=span,
        )


_MODELS_LOCK = threading.Lock()
"""The captioner and the embedder are called by one thread at a time (`LocalExecutor` runs
annotations side by side; a transformers tokenizer used by two threads at once fails with
"Already borrowed", and a model's forward gains nothing from a second caller on the same CPUs)."""

_BARS_LOCK = threading.Lock()
"""Guards `TranscodeStage._bars` and `._interlaced` (a module lock: the stage stays picklable
for Ray actors)."""

SPAN_BYTES = 256 << 20
"""Largest span (decoded bytes) the transcode stage holds so that the picture checks and the
encoder share one decode: ~7 s of 720p, ~3 s of 1080p; a longer span is decoded twice."""


def frame_bytes(v: ProbedVideo) -> int:
    """Bytes of one decoded frame of `v` (its planes; 4:2:0 1.5 bytes a pixel, 4:4:4 3; twice
    that above 8 bits)."""
    fmt = v.pix_fmt or ""
    per = 1.5 if "420" in fmt or "nv12" in fmt else 2.0 if "422" in fmt else 3.0
    deep = any(b in fmt for b in ("p10", "p12", "p14", "p16"))
    return int(v.width * v.height * per * (2 if deep else 1))


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
            f"picture {c.w}x{c.h} at ({c.x}, {c.y}) once any black bars are cropped: below the "
            f"minimum {f.min_width}x{f.min_height} (filters.min_width x filters.min_height)"
        )
    return blocky_reason(look.blockiness, cfg)


def blocky_reason(blockiness: float, cfg: CurateConfig) -> str | None:
    """The reject reason of a span whose source `blockiness` is above ``max_blockiness``."""
    pic = cfg.picture
    if pic.max_blockiness is None or blockiness <= pic.max_blockiness:
        return None
    return (
        f"blocky: compression blockiness {blockiness:.2f} above max_blockiness="
        f"{pic.max_blockiness:g} (excess luma step on the 8x8 block grid, {pic.sample_frames} "
        "sampled frames)"
    )


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
class AnnotateStage(MapStage):
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

    def _clip_file(self, item: ClipTask) -> str:
        """A local file of the clip: the encoder's output on this machine, else the pending
        object (another worker encoded it), else the committed one (a duplicate video's twin
        committed it first)."""
        if os.path.exists(item.local_path):
            return item.local_path
        pending = pending_uri(self.dst, item.clip_id)
        if storage.is_remote(pending):
            return local_copy(pending if storage.exists(pending) else item.uri, self.work_dir)
        return pending if os.path.exists(pending) else local_copy(item.uri, self.work_dir)

    def one(self, item: ClipTask) -> list[Item]:
        if self._embedder is None:
            self.setup()
        cfg, span = self.cfg, item.span
        path = self._clip_file(item)
        step = sample_step(item.fps, cfg.filters.sample_fps)  # the frames sample_indices picks
        sampled = decode_frames(path, width=cfg.analysis_width, every=step)  # (T, h, w, 3)
        scores = score_frames(sampled, cfg.filters)
        reasons = reject_reasons(
            scores,
            width=item.width,
            height=item.height,
            duration_s=item.duration_s,
            cfg=cfg.filters,
        )
        blocky = blocky_reason(item.blockiness, cfg)  # a span the transcode stage found still
        if blocky is not None and motion_reason(scores, cfg.filters) is None:
            reasons.append(blocky)  # it moves after all: blocky (else no motion is the cause)
        times = dict(start_s=span.start_s, end_s=span.end_s, duration_s=item.duration_s)
        with _MODELS_LOCK:
            cap = caption_clip(self._captioner, span.video.url, times | {"fps": item.fps}, path)
        if cap.source == "none" and cfg.require_caption:
            reasons.append(no_caption_reason(cap))
        if reasons:
            remove_clip(pending_uri(self.dst, item.clip_id))
            remove_clip(item.uri)  # committed by an earlier run with other filter settings
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
        with _MODELS_LOCK:
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
