"""Step-time overhead of checkpointing every N steps: none vs synchronous vs asynchronous DCP.

    .venv/bin/python benchmarks/checkpoint.py [--steps 12] [--every 4] [--hidden 512] [--depth 4]

One process, CPU. The model is sized so the save is visible: a DiT of ~20 M parameters whose
checkpoint (weights + EMA + two AdamW moments, fp32) is ~310 MB. Each mode trains the same steps
from the same seed and saves every ``--every`` steps through the one checkpoint manager (manifest
with sha256 included). Columns:

* ``train ms``: median time of a training step alone;
* ``blocked ms``: mean time the training loop spends inside one save call — the whole save when
  synchronous, the staging copy to host memory (plus waiting for a previous save still being
  written) when asynchronous;
* ``wall s``: the whole run, the wait for the last asynchronous save included;
* ``overhead``: (wall - wall without checkpoints) / steps, per step.

On a CPU-only machine the background write competes with training for the same cores, so
asynchronous saves also slow the steps that run while they are written; on a GPU node training
runs on the GPU and the overlap is nearly free.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import torch

from vfm_core.checkpoints.manager import CheckpointManager, save_trainer
from vfm_core.config import apply_overrides
from vfm_core.recipes import get_recipe
from vfm_core.train.trainer import Trainer


def run(mode: str, args: argparse.Namespace, root: Path) -> dict:
    cfg = apply_overrides(
        get_recipe("dit-tiny"),
        [
            f"model.hidden={args.hidden}",
            f"model.depth={args.depth}",
            "data.batch_size=1",
            "data.latent_height=8",
            "data.latent_width=8",
            "train.device=cpu",
            "tracking.mlflow=false",
            f"train.steps={args.steps}",
        ],
    )
    tr = Trainer(cfg)
    ckpt = CheckpointManager(root / mode, keep=2, async_save=mode == "async")
    tr.train_step(tr.source.next_batch())  # warm-up, not timed
    train, blocked = [], []
    t_start = time.perf_counter()
    for _ in range(args.steps):
        t0 = time.perf_counter()
        tr.train_step(tr.source.next_batch())
        t1 = time.perf_counter()
        train.append(t1 - t0)
        if mode != "none" and tr.step % args.every == 0:
            save_trainer(ckpt, tr)
            blocked.append(time.perf_counter() - t1)
    ckpt.wait()
    ckpt.close()
    wall = time.perf_counter() - t_start
    latest = ckpt.latest()
    size = sum(p.stat().st_size for p in latest.iterdir()) if latest else 0
    return {
        "mode": mode,
        "train_ms": 1e3 * statistics.median(train),
        "saves": len(blocked),
        "blocked_ms": 1e3 * statistics.mean(blocked) if blocked else 0.0,
        "wall_s": wall,
        "mb": size / 1e6,
        "params_m": tr.params / 1e6,
    }


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--every", type=int, default=4)
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--depth", type=int, default=4)
    ap.add_argument(
        "--repeat",
        type=int,
        default=3,
        help="rounds of none / sync / async, interleaved; medians are printed",
    )
    args = ap.parse_args()
    torch.set_num_threads(max(1, torch.get_num_threads()))
    modes = ("none", "sync", "async")
    root = Path(tempfile.mkdtemp(prefix="vfm-bench-ckpt-"))
    runs: dict[str, list[dict]] = {m: [] for m in modes}
    try:  # interleaved rounds: load from other work on a shared machine hits every mode alike
        for i in range(max(1, args.repeat)):
            for mode in modes:
                runs[mode].append(run(mode, args, root / str(i)))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    rows = [
        {
            **rs[0],
            **{
                k: statistics.median(r[k] for r in rs) for k in ("train_ms", "blocked_ms", "wall_s")
            },
        }
        for rs in runs.values()
    ]
    base = rows[0]["wall_s"]
    print(
        f"checkpoint every {args.every} steps, {args.steps} steps, {rows[0]['params_m']:.1f} M "
        f"params, checkpoint {rows[1]['mb']:.0f} MB, {torch.get_num_threads()} CPU threads, "
        f"median of {max(1, args.repeat)} interleaved rounds"
    )
    print(
        f"{'mode':6s} {'saves':>5s} {'train ms':>9s} {'blocked ms':>11s} {'wall s':>7s} "
        f"{'overhead/step':>14s}"
    )
    for r in rows:
        over = (r["wall_s"] - base) / args.steps
        print(
            f"{r['mode']:6s} {r['saves']:5d} {r['train_ms']:9.1f} {r['blocked_ms']:11.1f} "
            f"{r['wall_s']:7.2f} {1e3 * over:11.1f} ms"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
