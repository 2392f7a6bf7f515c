"""Memory of model construction: resident memory (RSS) per rank right after the trainer is built
and at its peak after one training step, one process vs ``--nproc 4 --dp-shard 4``, for a paper
model at its real width and heads with a reduced depth (default dit-7b, ``model.depth=2``, small
latents), beside the construction order the trainer used before (every rank builds the whole
model, deep-copies it for the EMA, then shards both).

    .venv/bin/python benchmarks/construction.py [--recipe dit-7b] [--depth 2] [--ranks 4]

Now: the model is built on the meta device, cut and sharded, then each rank materialises only its
shards and draws only their initial values (``vfm_core.parallel.apply``); the EMA clones those
shards. A rank should hold about 1/ranks of the weights and EMA right after construction, and the
model states (weights, gradients, AdamW moments, EMA: 20 B per parameter) about 1/ranks after a
step. RSS includes the Python / torch runtime of each process (the "empty" row).
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import os
import resource
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "parallel"))
from parallel_harness import run_ranks  # noqa: E402  (the tests' one spawning harness)

GiB = 2**30


def _rss() -> float:
    """Current resident set size of this process, bytes."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _peak() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024.0


def _config(recipe: str, depth: int, ranks: int):
    from vfm_core.config import ParallelConfig, apply_overrides
    from vfm_core.recipes import get_recipe

    cfg = apply_overrides(
        get_recipe(recipe),
        [
            f"model.depth={depth}",
            "data.latent_frames=1",
            "data.latent_height=8",
            "data.latent_width=8",
            f"data.batch_size={ranks}",
            "train.device=cpu",
            "tracking.mlflow=false",
            "optim.warmup_steps=1",
        ],
    )
    return dataclasses.replace(cfg, parallel=ParallelConfig(dp_shard=ranks))


def _worker(rank: int, world: int, recipe: str, depth: int, mode: str) -> dict:
    import torch

    torch.set_num_threads(1)
    empty = _rss()
    cfg = _config(recipe, depth, world)
    if mode == "before":  # the old order: whole model + deep-copied EMA on every rank, then shard
        from vfm_core.families import build_model
        from vfm_core.parallel.dims import ParallelDims
        from vfm_core.parallel.parallelize import parallelize_dit

        model = build_model(cfg.model, seed=0)
        ema = copy.deepcopy(model).requires_grad_(False)
        built_peak = _peak()
        dims = ParallelDims(dp_shard=world, world_size=world)
        parallelize_dit(ema, parallel_dims=dims)
        parallelize_dit(model, parallel_dims=dims)
        return {"empty": empty, "built": _rss(), "built_peak": built_peak, "step_peak": None}
    from vfm_core.train.trainer import Trainer

    trainer = Trainer(cfg)
    built, built_peak = _rss(), _peak()
    trainer.train_step(trainer.source.next_batch())
    return {
        "empty": empty,
        "built": built,
        "built_peak": built_peak,
        "step_peak": _peak(),
        "params": trainer.params,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--recipe", default="dit-7b")
    ap.add_argument("--depth", type=int, default=2)
    ap.add_argument("--ranks", type=int, default=4)
    args = ap.parse_args()
    runs = [
        ("1 process", 1, "now"),
        (f"{args.ranks} ranks, FSDP", args.ranks, "now"),
        (f"{args.ranks} ranks, old order", args.ranks, "before"),
    ]
    rows = []
    for label, world, mode in runs:
        res = run_ranks(_worker, world, args.recipe, args.depth, mode)
        worst = max(res, key=lambda r: r["built_peak"])
        rows.append((label, world, worst))
        print(f"  {label}: done", file=sys.stderr)
    params = rows[0][2]["params"]
    print(
        f"## {args.recipe}, model.depth={args.depth}: {params / 1e9:.3f} B parameters "
        f"(fp32 weights {params * 4 / GiB:.2f} GiB; with EMA {params * 8 / GiB:.2f} GiB)\n"
    )
    print(
        f"{'construction':24s} {'ranks':>5s} {'empty':>7s} {'built':>7s} {'built-empty':>12s} "
        f"{'peak built':>10s} {'peak step':>10s}   (GiB per rank, the largest rank)"
    )
    for label, world, r in rows:
        step = f"{r['step_peak'] / GiB:>10.2f}" if r["step_peak"] else f"{'-':>10s}"
        print(
            f"{label:24s} {world:>5d} {r['empty'] / GiB:>7.2f} {r['built'] / GiB:>7.2f} "
            f"{(r['built'] - r['empty']) / GiB:>12.2f} {r['built_peak'] / GiB:>10.2f} {step}"
        )
    one, fsdp = rows[0][2], rows[1][2]
    ratio = (fsdp["built"] - fsdp["empty"]) / (one["built"] - one["empty"])
    print(
        f"\nafter construction a rank holds {ratio:.2f} of the one-process model + EMA "
        f"(ideal 1/{args.ranks} = {1 / args.ranks:.2f})"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
