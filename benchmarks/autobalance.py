"""Auto-balancing, measured: do Ray Data's autoscaled actor pools follow the bottleneck stage?

    .venv/bin/python benchmarks/autobalance.py [--short 24] [--long 2] [--seconds 40]
        [--cpus 2] [--pool 2] [--repeat 1] [--mlflow-uri URI] [--cache DIR]

Two workloads of synthetic videos (`vfm_core.video.synthetic`), curated by `RayExecutor` with
`record_events=True` (`vfm_core.curate.balance`):

  short   --short videos of 2.5 s, 128x72, one shot each (one clip per video): per-video and
          per-actor costs dominate; annotate and split took ~60% and ~25% of the CPU seconds
  long    --long videos of --seconds s, 640x360, 4 s shots (10 clips per 40 s): transcode (a
          640x360 H.264 encode per clip, ~40%) and annotate (~30%) dominate

Each runs in two modes with the same Ray CPUs (--cpus logical CPUs) and the same actor slots
(stages x --pool, each actor reserving CPUs / slots x 0.9):

  auto    autoscaled pools, 1 .. slots - (stages - 1) actors each (`RayExecutor(max_workers=..)`)
  fixed   a fixed pool of --pool actors per stage (`RayExecutor(pool_size=..)`)

The table: wall seconds of `curate`, videos/s and accepted clips/s, each stage's share of the busy
actor-seconds, the largest pool and the most busy actors at once per stage (in the order
probe/split/stitch/transcode/annotate), and the throughput ratio auto / fixed (median wall over
--repeat, the modes alternating). MLflow (a sqlite store in a temp dir unless --mlflow-uri): one
run per workload with the table (`autobalance.json`), the raw events (`events_{mode}.json`) and
`busy_actors_{workload}.png`, busy actors and pool size per stage over time for both modes.

Ray's slots are logical: on a machine with fewer cores than busy actors the OS shares the cores,
so a fixed pool's idle actors cost little and the throughput ratio says more about scheduling
than about hardware; the pool sizes show what the autoscaler decided. Ray Data's own account of
each decision ("Scaling up ... reason=utilization of 2.0 >= 1.75") is in the ray-data logs under
/tmp/ray/session_*/logs/ray-data/.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

from vfm_core.curate import CurateConfig, RayExecutor, curate
from vfm_core.curate.balance import BatchEvent, busy_timeline, pool_timeline, summarize
from vfm_core.video.synthetic import Segment, VideoSpec, make_video

STAGES = ("probe", "split", "stitch", "transcode", "annotate")
CFG = CurateConfig(min_len_s=1.0)  # the short videos are 2.5 s


def spec(seed: int, *, seconds: float, width: int, height: int, shot_s: float) -> VideoSpec:
    """`seconds` of hard-cut shots of `shot_s` (moving shapes and pans alternating)."""
    left, segs = round(seconds * 24), []
    while left > 0:
        n = min(round(shot_s * 24), left)
        segs.append(Segment(kind="moving" if len(segs) % 2 == 0 else "pan", n_frames=n))
        left -= n
    return VideoSpec(width=width, height=height, fps=24.0, segments=tuple(segs), seed=seed)


def make_inputs(root: Path, args: argparse.Namespace) -> dict[str, Path]:
    """The two workloads' source folders (videos already there are kept)."""
    plans = {
        "short": [spec(i, seconds=2.5, width=128, height=72, shot_s=3) for i in range(args.short)],
        "long": [
            spec(100 + i, seconds=args.seconds, width=640, height=360, shot_s=4)
            for i in range(args.long)
        ],
    }
    out = {}
    for name, specs in plans.items():
        frames = sum(g.n_frames for g in specs[0].segments) if specs else 0
        d = root / f"{name}-{len(specs)}x{frames}f"
        d.mkdir(parents=True, exist_ok=True)
        for i, s in enumerate(specs):
            if not (d / f"v{i:03d}.mp4").exists():
                make_video(d / f"v{i:03d}.mp4", s)
        out[name] = d
    return out


def run_once(src: Path, dst: Path, ex: RayExecutor) -> dict:
    t = time.perf_counter()
    out = curate(str(src), str(dst), executor=ex, config=CFG, progress=False)
    wall = time.perf_counter() - t
    return {
        "wall_s": wall,
        "n_videos": out["n_inputs"],
        "n_clips": out["n_clips"],
        "events": list(ex.events),
    }


def executors(args: argparse.Namespace) -> dict[str, RayExecutor]:
    slots = len(STAGES) * args.pool
    cpus = round(args.cpus / slots * 0.9, 3)  # the same reservation per actor in both modes
    kw = dict(num_cpus=args.cpus, cpus_per_worker=cpus, record_events=True)
    return {
        "auto": RayExecutor(max_workers=slots - (len(STAGES) - 1), **kw),
        "fixed": RayExecutor(pool_size=args.pool, **kw),
    }


def row(workload: str, mode: str, runs: list[dict]) -> dict:
    """One table row: the median wall over the repeats; stage figures from the first run."""
    wall = statistics.median(r["wall_s"] for r in runs)
    s = summarize(runs[0]["events"])

    def get(k: str) -> str:
        return "/".join(str(getattr(s[x], k)) if x in s else "-" for x in STAGES)

    return {
        "workload": workload,
        "mode": mode,
        "wall_s": round(wall, 2),
        "walls": " ".join(f"{r['wall_s']:.1f}" for r in runs),
        "videos_per_s": round(runs[0]["n_videos"] / wall, 3),
        "clips_per_s": round(runs[0]["n_clips"] / wall, 3),
        "n_clips": runs[0]["n_clips"],
        "busy_s": round(sum(v.busy_s for v in s.values()), 1),
        "busy_share": "/".join(f"{s[x].share:.0%}" if x in s else "-" for x in STAGES),
        "cpu_s": round(sum(v.cpu_s for v in s.values()), 1),
        "cpu_share": "/".join(f"{s[x].cpu_share:.0%}" if x in s else "-" for x in STAGES),
        "max_pool": get("max_pool"),
        "max_busy": get("max_busy"),
    }


def plot(workload: str, events: dict[str, list[BatchEvent]], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(events), 1, figsize=(9, 3.2 * len(events)), sharex=True)
    colours = dict(zip(STAGES, plt.get_cmap("tab10").colors, strict=False))
    for ax, (mode, evs) in zip(axes, events.items(), strict=True):
        busy, pool = busy_timeline(evs), pool_timeline(evs)
        for stage in STAGES:
            if stage not in busy:
                continue
            for tl, style, label in ((busy[stage], "-", stage), (pool[stage], ":", None)):
                if tl:
                    t, n = zip(*[(0.0, 0), *tl], strict=True)
                    ax.step(t, n, where="post", ls=style, color=colours[stage], label=label)
        ax.set_title(f"{workload}: {mode} pools (solid: busy actors, dotted: pool size)")
        ax.set_ylabel("actors")
        ax.legend(loc="upper right", fontsize=8)
    axes[-1].set_xlabel("seconds since the first actor started")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def log_mlflow(
    uri: str, workload: str, rows: list[dict], events: dict, png: Path, args: argparse.Namespace
) -> str:
    import mlflow

    from vfm_core.config import TrackingConfig
    from vfm_core.tracking import ensure_experiment

    exp = ensure_experiment(TrackingConfig(tracking_uri=uri, experiment="vfm-autobalance"))
    with mlflow.start_run(experiment_id=exp, run_name=f"autobalance {workload}") as run:
        mlflow.log_params(
            {
                "workload": workload,
                "cpus": args.cpus,
                "pool": args.pool,
                "short": args.short,
                "long": args.long,
                "seconds": args.seconds,
                "repeat": args.repeat,
            }
        )
        for r in rows:
            mlflow.log_metrics(
                {
                    f"{r['mode']}_wall_s": r["wall_s"],
                    f"{r['mode']}_videos_per_s": r["videos_per_s"],
                    f"{r['mode']}_clips_per_s": r["clips_per_s"],
                }
            )
        ratio = rows[1]["wall_s"] / rows[0]["wall_s"]
        mlflow.log_metric("throughput_ratio_auto_over_fixed", ratio)
        mlflow.log_table({k: [r[k] for r in rows] for k in rows[0]}, "autobalance.json")
        for mode, evs in events.items():
            mlflow.log_text(
                json.dumps([json.loads(e.to_json()) for e in evs]), f"events_{mode}.json"
            )
        mlflow.log_artifact(str(png))
        return run.info.run_id


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--short", type=int, default=24, help="videos of the short workload")
    ap.add_argument("--long", type=int, default=2, help="videos of the long workload")
    ap.add_argument("--seconds", type=float, default=40.0, help="length of a long video")
    ap.add_argument("--cpus", type=int, default=2, help="logical CPUs of the Ray instance")
    ap.add_argument("--pool", type=int, default=2, help="actors per stage of the fixed pools")
    ap.add_argument("--repeat", type=int, default=1, help="runs per mode (median wall)")
    ap.add_argument("--mlflow-uri", default="", help="MLflow store (default: sqlite in a tmp dir)")
    ap.add_argument("--cache", default="", help="keep the generated videos here")
    args = ap.parse_args()
    for name in ("short", "long", "seconds", "cpus", "pool", "repeat"):
        if getattr(args, name) < 1:
            ap.error(f"--{name} must be >= 1")

    tmp = Path(tempfile.mkdtemp(prefix="vfm-autobalance-"))
    uri = args.mlflow_uri or f"sqlite:///{tmp / 'mlflow' / 'mlflow.db'}"
    (tmp / "mlflow").mkdir()
    t = time.perf_counter()
    srcs = make_inputs(Path(args.cache) if args.cache else tmp / "src", args)
    print(f"inputs ready in {time.perf_counter() - t:.1f} s")

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    import ray

    ray.init(
        num_cpus=args.cpus,
        include_dashboard=False,
        log_to_driver=False,
        object_store_memory=256 * 1024 * 1024,
    )
    exs = executors(args)
    table: list[dict] = []
    try:
        for workload, src in srcs.items():
            runs: dict[str, list[dict]] = {m: [] for m in exs}
            for i in range(args.repeat):
                order = list(exs) if i % 2 == 0 else list(exs)[::-1]
                for mode in order:
                    dst = tmp / "dst" / f"{workload}-{mode}-{i}"
                    runs[mode].append(run_once(src, dst, exs[mode]))
            rows = [row(workload, m, runs[m]) for m in exs]
            events = {m: runs[m][0]["events"] for m in exs}
            png = plot(workload, events, tmp / f"busy_actors_{workload}.png")
            run_id = log_mlflow(uri, workload, rows, events, png, args)
            table += rows
            print(f"{workload}: done, MLflow run {run_id}")
    finally:
        ray.shutdown()

    cols = [
        "workload",
        "mode",
        "wall_s",
        "walls",
        "videos_per_s",
        "clips_per_s",
        "n_clips",
        "busy_s",
        "busy_share",
        "cpu_s",
        "cpu_share",
        "max_pool",
        "max_busy",
    ]
    width = {c: max(len(c), *(len(str(r[c])) for r in table)) for c in cols}
    print(
        "\nper stage (" + "/".join(STAGES) + "): busy_share and cpu_share of the batches' "
        "actor-seconds and CPU seconds; max_pool, max_busy: most actors in the pool / busy"
    )
    print("  ".join(c.ljust(width[c]) for c in cols))
    for r in table:
        print("  ".join(str(r[c]).ljust(width[c]) for c in cols))
    for workload in srcs:
        a, f = (
            next(r for r in table if r["workload"] == workload and r["mode"] == m)
            for m in ("auto", "fixed")
        )
        print(f"{workload}: throughput auto / fixed = {f['wall_s'] / a['wall_s']:.2f}")
    print(f"MLflow: {uri} (experiment vfm-autobalance); plots and events under {tmp}")


if __name__ == "__main__":
    main()
