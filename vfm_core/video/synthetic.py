"""Synthetic videos with known ground truth (cuts, dissolves, static and black segments).

A video is a list of `Segment`s; each is one "shot" rendered from its own seeded scene (a
panning low-frequency texture in the scene's palette with moving discs and boxes). A segment
starts with a hard cut or with a dissolve of `transition_frames` frames from the previous scene
(which keeps moving under the blend). `make_video` encodes it with libx264 and returns the
`GroundTruth`: segment ranges, cut frames and fade ranges, which the splitter tests and the
curation benchmark score against. Everything is deterministic given `VideoSpec.seed`. With
`VideoSpec.audio_rate` it has a sound track too, one tone per segment (`tone_hz`), whose pitch
steps at the cuts (`tone_levels` tells which segment's tone a stretch of sound holds).

`make_bad_input` writes the malformed / unusual inputs the curation stages must reject or handle.
"""

from __future__ import annotations

import io
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Literal

import av
import numpy as np

from vfm_core.video.caption_vocabulary import DIRECTIONS, PALETTE
from vfm_core.video.transcode import encode_h264

OBJECT_MOVE_FRACTION = 0.57
"""kind "object": the share of the segment its object moves for, centre to edge (then held): 18
frames of a 32-frame shot, so a 17-frame training window from the shot's start shows all of it."""

SegmentKind = Literal["moving", "pan", "static", "black", "object"]
TransitionKind = Literal["cut", "dissolve"]
BadKind = Literal[
    "zero_byte",
    "truncated",
    "truncated_faststart",
    "not_video",
    "audio_only",
    "cover_art",
    "one_frame",
    "vfr",
    "rotated",
    "yuv444",
    "10bit",
]
BAD_KINDS: tuple[BadKind, ...] = BadKind.__args__  # type: ignore[attr-defined]


@dataclass(kw_only=True, slots=True, frozen=True)
class Segment:
    """One shot of a synthetic video."""

    kind: SegmentKind = "moving"
    """moving: shapes over a panning texture; pan: texture only; static: one still frame; black."""
    n_frames: int = 48
    """Frames in the segment, including its incoming transition."""
    transition: TransitionKind = "cut"
    """How the segment begins (ignored for the first segment)."""
    transition_frames: int = 12
    """Length of a dissolve, in frames (the first frames of this segment)."""
    subject: tuple[str, str, str, str] | None = None
    """kind "object": (colour, shape, direction, background) of the one object it shows, e.g.
    ("red", "circle", "right", "plain"); see :mod:`vfm_core.video.caption_vocabulary`."""
    caption: str | None = None
    """Caption of this segment (written to the JSON sidecar with its time range)."""


@dataclass(kw_only=True, slots=True, frozen=True)
class VideoSpec:
    """A synthetic video: size, rate, segments, encoder settings and an optional sidecar caption."""

    width: int = 128
    """Frame width in pixels (even)."""
    height: int = 72
    """Frame height in pixels (even)."""
    fps: float = 24.0
    """Constant frame rate."""
    segments: tuple[Segment, ...] = field(default_factory=tuple)
    """The shots, in order."""
    seed: int = 0
    """Seeds every scene (palette, texture, shapes, motion)."""
    crf: int = 18
    """libx264 quality (lower is better)."""
    preset: str = "ultrafast"
    """libx264 preset for writing the test video (speed over size)."""
    caption: str | None = None
    """If set, written to a sidecar `<stem>.txt` next to the video."""
    audio_rate: int | None = None
    """Sample rate of a mono AAC sound track (None: no audio stream): segment i is a sine tone
    of `tone_hz(i)` over exactly its frames' time, so a cut is also a step in pitch."""


@dataclass(kw_only=True, slots=True, frozen=True)
class GroundTruth:
    """What a synthetic video contains, in frame indices (end exclusive)."""

    fps: float
    width: int
    height: int
    n_frames: int
    segments: tuple[tuple[int, int], ...]
    """[start, end) of every segment."""
    kinds: tuple[SegmentKind, ...]
    """Kind of every segment."""
    cuts: tuple[int, ...]
    """First frame of every segment that starts with a hard cut."""
    fades: tuple[tuple[int, int], ...]
    """[start, end) of every dissolve (blended frames)."""
    caption: str | None = None

    def transitions(self) -> list[tuple[int, int]]:
        """All transitions as frame intervals: a cut at c is (c, c), a fade is (start, end)."""
        return sorted([(c, c) for c in self.cuts] + list(self.fades))


def demo_spec(*, width: int = 128, height: int = 72, fps: float = 24.0, seed: int = 0) -> VideoSpec:
    """A ~17 s video with every feature: 5 hard cuts, 2 dissolves, a static and a black segment."""
    s = Segment
    return VideoSpec(
        width=width,
        height=height,
        fps=fps,
        seed=seed,
        segments=(
            s(kind="moving", n_frames=60),
            s(kind="pan", n_frames=50),
            s(kind="moving", n_frames=70, transition="dissolve", transition_frames=12),
            s(kind="static", n_frames=40),
            s(kind="black", n_frames=20),
            s(kind="moving", n_frames=60),
            s(kind="pan", n_frames=55, transition="dissolve", transition_frames=20),
            s(kind="moving", n_frames=45),
        ),
        caption="moving shapes over coloured textures",
    )


class _Scene:
    """A seeded scene: palette texture larger than the frame (for panning) plus moving shapes."""

    def __init__(
        self,
        rng: np.random.Generator,
        kind: SegmentKind,
        w: int,
        h: int,
        subject: tuple[str, str, str, str] | None = None,
        n_frames: int = 1,
    ) -> None:
        self.kind, self.w, self.h = kind, w, h
        self.subject, self.n_frames = subject, n_frames
        pad = max(8, w // 4)
        self.pad = pad
        tw, th = w + 2 * pad, h + 2 * pad
        # low-frequency noise on a coarse grid, bilinearly upsampled: (th, tw) in [0, 1]
        gy, gx = int(rng.integers(3, 7)), int(rng.integers(4, 9))
        grid = rng.random((gy, gx))
        ys, xs = np.linspace(0, gy - 1, th), np.linspace(0, gx - 1, tw)
        y0, x0 = np.floor(ys).astype(int).clip(0, gy - 2), np.floor(xs).astype(int).clip(0, gx - 2)
        fy, fx = (ys - y0)[:, None], (xs - x0)[None, :]
        v = (
            grid[y0][:, x0] * (1 - fy) * (1 - fx)
            + grid[y0 + 1][:, x0] * fy * (1 - fx)
            + grid[y0][:, x0 + 1] * (1 - fy) * fx
            + grid[y0 + 1][:, x0 + 1] * fy * fx
        )  # (th, tw)
        # palette: two random colours far enough apart, plus fine static grain
        c1, c2 = rng.integers(0, 256, 3), rng.integers(0, 256, 3)
        grain = rng.normal(0, 10, (th, tw, 1))
        tex = c1[None, None, :] * v[..., None] + c2[None, None, :] * (1 - v[..., None]) + grain
        self.texture = tex.clip(0, 255).astype(np.uint8)  # (th, tw, 3)
        speed = max(w, h) / 256.0
        ang = rng.uniform(0, 2 * np.pi)
        self.pan = np.array([np.cos(ang), np.sin(ang)]) * speed * rng.uniform(0.5, 1.5)
        self.shapes: list[tuple[str, np.ndarray, np.ndarray, float, np.ndarray]] = []
        for _ in range(int(rng.integers(2, 5))):
            kind_s = "disc" if rng.random() < 0.5 else "box"
            pos = np.array([rng.uniform(0, w), rng.uniform(0, h)])
            vel = rng.normal(0, 1, 2) * speed * 2
            size = rng.uniform(0.06, 0.16) * min(w, h) * 1.5
            self.shapes.append((kind_s, pos, vel, size, rng.integers(0, 256, 3).astype(np.uint8)))
        # kind "object": its start near the centre, drawn the same way for every direction
        self.start = rng.uniform(-0.1, 0.1, 2) * min(w, h) if kind == "object" else np.zeros(2)

    def render(self, t: int) -> np.ndarray:
        """Frame t of this scene: (h, w, 3) uint8."""
        w, h, pad = self.w, self.h, self.pad
        if self.kind == "black":
            return np.zeros((h, w, 3), np.uint8)
        if self.kind == "object":
            return self._render_object(t)
        tt = 0 if self.kind == "static" else t
        # bounce the pan inside the padding
        off = self.pan * tt
        ox = int(round(pad + _tri(off[0], pad)))
        oy = int(round(pad + _tri(off[1], pad)))
        frame = self.texture[oy : oy + h, ox : ox + w].copy()  # (h, w, 3)
        if self.kind in ("moving", "static"):
            for kind_s, pos, vel, size, col in self.shapes:
                cx = _bounce(pos[0] + vel[0] * tt, w)
                cy = _bounce(pos[1] + vel[1] * tt, h)
                r = size / 2
                x0, x1 = int(max(cx - r, 0)), int(min(cx + r + 1, w))
                y0, y1 = int(max(cy - r, 0)), int(min(cy + r + 1, h))
                if x1 <= x0 or y1 <= y0:
                    continue
                if kind_s == "box":
                    frame[y0:y1, x0:x1] = col
                else:
                    yy, xx = np.ogrid[y0:y1, x0:x1]
                    m = (yy - cy) ** 2 + (xx - cx) ** 2 <= r * r
                    frame[y0:y1, x0:x1][m] = col
        return frame

    def _render_object(self, t: int) -> np.ndarray:
        """One object of the subject's colour and shape on a plain dark colour or a darkened
        texture of the scene's palette, moving from near the centre (within 10% of the frame) out
        in its direction at constant speed until it meets the edge, by 57% of the segment, and
        held there. Its size is a quarter of the frame's shorter side.

        The start is drawn alike for every direction, so a clip's first frame says nothing of
        where the object goes: a model has to take the direction from the caption. (Crossing the
        frame from the opposite edge, as before, let the first frame's position give the
        direction away; an autoregressive model then ignored the caption's direction word.)"""
        colour, shape, direction, background = self.subject or ("white", "square", "right", "plain")
        w, h, pad = self.w, self.h, self.pad
        if background == "plain":  # one dark colour per shot (so cuts show in colour)
            frame = np.empty((h, w, 3), np.uint8)
            frame[:] = (self.texture[pad, pad].astype(np.float32) * 0.3 + 10).astype(np.uint8)
        else:
            frame = (self.texture[pad : pad + h, pad : pad + w] * 0.45).astype(np.uint8)
        size = 0.25 * min(w, h)
        dx, dy = DIRECTIONS[direction]
        reach = 0.5 * (min(w, h) - size)  # centre -> edge
        travel = min(1.0, t / max(1.0, OBJECT_MOVE_FRACTION * (self.n_frames - 1))) * reach
        cx = float(np.clip(w / 2 + self.start[0] + dx * travel, size / 2, w - size / 2))
        cy = float(np.clip(h / 2 + self.start[1] + dy * travel, size / 2, h - size / 2))
        r = size / 2
        yy, xx = np.ogrid[0:h, 0:w]
        if shape == "circle":
            m = (yy - cy) ** 2 + (xx - cx) ** 2 <= r * r
        else:
            m = (np.abs(yy - cy) <= r) & (np.abs(xx - cx) <= r)
        frame[m] = PALETTE[colour]
        return frame


def _bounce(x: float, n: int) -> float:
    """Reflect x into [0, n)."""
    p = x % (2 * n)
    return p if p < n else 2 * n - p


def _tri(x: float, a: float) -> float:
    """Triangle wave in [-a, a] (panning that turns back at the texture edge)."""
    return abs((x + a) % (4 * a) - 2 * a) - a


def render_frames(spec: VideoSpec) -> tuple[Iterator[np.ndarray], GroundTruth]:
    """Frames (each (H, W, 3) uint8, lazily rendered) and the ground truth of `spec`."""
    if not spec.segments:
        raise ValueError("VideoSpec.segments is empty")
    w, h = spec.width - spec.width % 2, spec.height - spec.height % 2
    rng = np.random.default_rng(spec.seed)
    scenes = [_Scene(rng, seg.kind, w, h, seg.subject, seg.n_frames) for seg in spec.segments]
    bounds: list[tuple[int, int]] = []
    cuts: list[int] = []
    fades: list[tuple[int, int]] = []
    start = 0
    for i, seg in enumerate(spec.segments):
        if seg.n_frames < 1:
            raise ValueError(f"segment {i} has n_frames={seg.n_frames}")
        bounds.append((start, start + seg.n_frames))
        if i > 0:
            if seg.transition == "dissolve":
                n = min(seg.transition_frames, seg.n_frames)
                fades.append((start, start + n))
            else:
                cuts.append(start)
        start += seg.n_frames
    gt = GroundTruth(
        fps=spec.fps,
        width=w,
        height=h,
        n_frames=start,
        segments=tuple(bounds),
        kinds=tuple(seg.kind for seg in spec.segments),
        cuts=tuple(cuts),
        fades=tuple(fades),
        caption=spec.caption,
    )

    def frames() -> Iterator[np.ndarray]:
        for i, seg in enumerate(spec.segments):
            n_dis = (
                min(seg.transition_frames, seg.n_frames)
                if i > 0 and seg.transition == "dissolve"
                else 0
            )
            prev_len = bounds[i - 1][1] - bounds[i - 1][0] if i > 0 else 0
            for k in range(seg.n_frames):
                cur = scenes[i].render(k)
                if k < n_dis:
                    a = (k + 1) / (n_dis + 1)
                    old = scenes[i - 1].render(prev_len + k).astype(np.float32)
                    cur = (old * (1 - a) + cur.astype(np.float32) * a + 0.5).astype(np.uint8)
                yield cur

    return frames(), gt


def tone_hz(segment: int) -> float:
    """The pitch of segment `segment`'s tone in a video with sound (`VideoSpec.audio_rate`)."""
    return 400.0 + 200.0 * segment


def render_sound(spec: VideoSpec, gt: GroundTruth) -> np.ndarray:
    """(1, S) float32 samples of `spec`'s sound track (S = n_frames / fps * audio_rate)."""
    rate = spec.audio_rate or 0
    ends = [a for a, _ in gt.segments] + [gt.n_frames]
    edges = [round(f / spec.fps * rate) for f in ends]  # segment i: samples [edges[i], edges[i+1])
    out = np.zeros((1, edges[-1]), np.float32)  # (1, S)
    for i, (a, b) in enumerate(zip(edges, edges[1:])):
        t = np.arange(a, b) / rate
        out[0, a:b] = 0.3 * np.sin(2 * np.pi * tone_hz(i) * t)
    return out


def tone_levels(
    samples: np.ndarray, rate: int, n_segments: int, *, window_s: float = 0.01
) -> np.ndarray:
    """(W, n_segments) amplitude of each segment's tone (`tone_hz`) in consecutive `window_s`
    windows of mono `samples` (S,): which segment's sound a stretch of a clip holds."""
    w = max(1, round(window_s * rate))
    x = samples[: len(samples) // w * w].reshape(-1, w)  # (W, w)
    t = np.arange(w) / rate
    waves = np.exp(-2j * np.pi * np.outer(t, [tone_hz(i) for i in range(n_segments)]))  # (w, n)
    return np.abs(x @ waves) * 2 / w  # (W, n)


def make_video(path: str | os.PathLike[str], spec: VideoSpec) -> GroundTruth:
    """Render `spec`, encode it to H.264 MP4 at `path` (+ sidecar caption) and return the truth."""
    frames, gt = render_frames(spec)
    sound = (render_sound(spec, gt), spec.audio_rate) if spec.audio_rate else None
    encode_h264(frames, path, fps=spec.fps, crf=spec.crf, preset=spec.preset, sound=sound)
    if any(seg.caption for seg in spec.segments):  # per-segment captions: the JSON sidecar
        rows = [
            {"start_s": a / spec.fps, "end_s": b / spec.fps, "caption": seg.caption}
            for seg, (a, b) in zip(spec.segments, gt.segments)
            if seg.caption
        ]
        doc = {"caption": spec.caption or "", "segments": rows}
        Path(path).with_suffix(".json").write_text(json.dumps(doc, indent=1) + "\n")
    elif spec.caption is not None:
        Path(path).with_suffix(".txt").write_text(spec.caption + "\n")
    return gt


def _write_raw(
    path: Path,
    frames: list[np.ndarray],
    *,
    pts: list[int],
    time_base: Fraction,
    rate: Fraction,
    pix_fmt: str = "yuv420p",
    rotation: int = 0,
    faststart: bool = True,
) -> None:
    """Encode RGB frames with explicit timestamps / pixel format / display rotation."""
    opts = {"movflags": "+faststart"} if faststart else {}
    with av.open(str(path), mode="w", options=opts) as out:
        st = out.add_stream("libx264", rate=rate)
        h, w = frames[0].shape[:2]
        st.width, st.height, st.pix_fmt = w, h, pix_fmt
        st.time_base = time_base
        st.codec_context.time_base = time_base
        st.options = {"preset": "ultrafast", "crf": "20"}
        if rotation:
            st.set_display_rotation(rotation)
        for arr, p in zip(frames, pts, strict=True):
            vf = av.VideoFrame.from_ndarray(arr, format="rgb24").reformat(format=pix_fmt)
            vf.pts = p
            out.mux(st.encode(vf))
        out.mux(st.encode(None))


def make_truncated(
    path: str | os.PathLike[str], spec: VideoSpec, *, keep: float, faststart: bool = True
) -> Path:
    """`spec` encoded as MP4 at `path`, then cut after `keep` (0..1) of its media data, as a copy
    that stopped early leaves it. With `faststart` the sample index (moov) comes first and stays:
    the file states its whole duration, the first frames decode (none at `keep` 0: the header
    only); without it the index was to come last and is lost (the file cannot be opened)."""
    if not 0.0 <= keep < 1.0:
        raise ValueError(f"make_truncated: keep must be in [0, 1), got {keep}")
    p = Path(path)
    full = p.with_name(p.stem + ".full" + p.suffix)
    frames = list(render_frames(spec)[0])
    n = len(frames)
    rate = Fraction(spec.fps).limit_denominator(1001)
    _write_raw(full, frames, pts=list(range(n)), time_base=1 / rate, rate=rate, faststart=faststart)
    data = full.read_bytes()
    full.unlink()
    with av.open(io.BytesIO(data)) as c:  # where the media data starts: the first sample
        entries = c.streams.video[0].index_entries
        start = min(entries[i].pos for i in range(len(entries))) if faststart else 0
    p.write_bytes(data[: start + int((len(data) - start) * keep)])
    return p


def make_bad_input(kind: BadKind, path: str | os.PathLike[str], *, seed: int = 0) -> Path:
    """Write one malformed or unusual input at `path` (kinds: `BAD_KINDS`) and return the path.

    zero_byte / truncated (moov atom lost) / truncated_faststart (media data cut) / not_video (text)
    / audio_only (AAC) / cover_art (a song: AAC and its cover picture, a one-image video stream
    marked attached_pic) must be rejected; one_frame / vfr (irregular timestamps) / rotated (display
    matrix 90 deg) / yuv444 / 10bit (yuv420p10le) are valid and must be processed.
    """
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    spec = VideoSpec(width=96, height=64, fps=24.0, seed=seed, segments=(Segment(n_frames=48),))
    frames = list(render_frames(spec)[0])
    tb, rate = Fraction(1, 24), Fraction(24)
    if kind == "zero_byte":
        p.write_bytes(b"")
    elif kind == "not_video":
        p.write_text("this is not a video, just text with an .mp4 name\n" * 20)
    elif kind in ("truncated", "truncated_faststart"):
        fast = kind == "truncated_faststart"
        make_truncated(p, spec, keep=0.5 if fast else 0.6, faststart=fast)
    elif kind in ("audio_only", "cover_art"):
        with av.open(str(p), mode="w") as out:
            st = out.add_stream("aac", rate=44100)
            if kind == "cover_art":
                cover = out.add_stream("mjpeg", rate=1)
                cover.width, cover.height, cover.pix_fmt = 96, 64, "yuvj420p"
                cover.disposition = av.stream.Disposition.attached_pic
                art = av.VideoFrame.from_ndarray(frames[0], format="rgb24")
                for pkt in cover.encode(art.reformat(format="yuvj420p")):
                    pkt.pts = pkt.dts = 0
                    out.mux(pkt)
            sr = 44100
            t = np.arange(sr) / sr
            tone = (0.3 * np.sin(2 * np.pi * 440 * t)).astype(np.float32)[None, :]  # (1, S)
            af = av.AudioFrame.from_ndarray(tone, format="fltp", layout="mono")
            af.sample_rate = sr
            af.pts = 0
            out.mux(st.encode(af))
            out.mux(st.encode(None))
    elif kind == "one_frame":
        _write_raw(p, frames[:1], pts=[0], time_base=tb, rate=rate)
    elif kind == "vfr":
        # alternating 30 ms / 60 ms frame durations in a 1/1000 time base
        pts = np.cumsum([0] + [30 if i % 2 else 60 for i in range(47)]).tolist()
        _write_raw(p, frames, pts=pts, time_base=Fraction(1, 1000), rate=Fraction(22))
    elif kind == "rotated":
        _write_raw(p, frames, pts=list(range(48)), time_base=tb, rate=rate, rotation=90)
    elif kind == "yuv444":
        _write_raw(p, frames, pts=list(range(48)), time_base=tb, rate=rate, pix_fmt="yuv444p")
    elif kind == "10bit":
        _write_raw(p, frames, pts=list(range(48)), time_base=tb, rate=rate, pix_fmt="yuv420p10le")
    else:
        raise ValueError(f"unknown bad input kind {kind!r}; expected one of {BAD_KINDS}")
    return p


def score_transitions(
    pred: list[tuple[int, int]], truth: list[tuple[int, int]], *, tol: int = 2
) -> dict[str, float]:
    """Precision / recall / F1 of predicted vs true transitions, one-to-one, within ±`tol` frames.

    Both sides are frame intervals (a hard cut at c is (c, c), a fade or a dropped gap is
    (start, end)); a prediction matches a truth interval when they overlap after widening by `tol`.
    Greedy matching in order of distance between interval centres.
    """
    pairs = []
    for i, (pa, pb) in enumerate(pred):
        for j, (ta, tb) in enumerate(truth):
            if max(pa, ta) <= min(pb, tb) + tol:
                pairs.append((abs((pa + pb) - (ta + tb)) / 2, i, j))
    used_p: set[int] = set()
    used_t: set[int] = set()
    for _, i, j in sorted(pairs):
        if i not in used_p and j not in used_t:
            used_p.add(i)
            used_t.add(j)
    tp = len(used_p)
    prec = tp / len(pred) if pred else 1.0
    rec = tp / len(truth) if truth else 1.0
    f1 = 2 * prec * rec / (prec + rec) if prec + rec > 0 else 0.0
    return {
        "precision": prec,
        "recall": rec,
        "f1": f1,
        "tp": tp,
        "n_pred": len(pred),
        "n_true": len(truth),
    }
