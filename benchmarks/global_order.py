"""The global sample order at internet scale: the Feistel order (vfm_core/data/plan.GlobalOrder)
against a materialised per-epoch permutation (the order before it, the peer), by simulation.

    .venv/bin/python benchmarks/global_order.py [--sizes 1e6,1e7,1e8] [--batch 256] [--ranks 64]

For each dataset size N (no data: the order only needs N): memory the order holds (tracemalloc
peak), time to restore (a fresh order at a mid-epoch position, as a resumed job does) and time to
plan one step (the global batch's positions -> sample ids; with ``--ranks`` simulated data-
parallel ranks each maps only its share, the slowest rank's time is reported).
"""

from __future__ import annotations

import argparse
import time
import tracemalloc

import numpy as np

from vfm_core.data.plan import GlobalOrder


def materialised(n: int, seed: int, position: int):
    """Restore: draw the epoch's permutation (N int64); returns the step planner."""
    perm = np.random.Generator(np.random.PCG64([seed, position // n])).permutation(n)
    return lambda start, count: perm[np.arange(start, start + count) % n]


def feistel(n: int, seed: int, position: int):
    """Restore: key the epoch's Feistel permutation; returns the step planner."""
    order = GlobalOrder(n, seed).epoch_order(position // n)
    return lambda start, count: order.map(np.arange(start, start + count) % n)


def measure(restore_fn, n: int, batch: int, ranks: int) -> dict:
    position = n // 2 + 12345  # mid-epoch: a resumed job
    tracemalloc.start()
    t0 = time.perf_counter()
    plan = restore_fn(n, 0, position)
    plan(position, 1)
    restore = time.perf_counter() - t0
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    share = max(1, batch // ranks)
    t0 = time.perf_counter()
    for r in range(ranks):  # each rank maps only its share of the next step
        plan(position + r * share, share)
    per_rank = (time.perf_counter() - t0) / ranks
    return {"restore_s": restore, "memory_mb": peak / 2**20, "plan_ms_per_rank": per_rank * 1e3}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1e6,1e7,1e8")
    ap.add_argument("--batch", type=int, default=256, help="global batch (positions per step)")
    ap.add_argument("--ranks", type=int, default=64, help="simulated data-parallel ranks")
    ap.add_argument("--peer-max", type=float, default=1e8, help="largest N for the peer")
    args = ap.parse_args()
    print(
        f"global batch {args.batch}; {args.ranks} simulated ranks map "
        f"{max(1, args.batch // args.ranks)} positions each; restore = build the order at a "
        "mid-epoch position (the peer draws the whole epoch's permutation)\n"
    )
    print("| N | order | restore s | memory MB | plan ms / rank / step |")
    print("|---|---|---|---|---|")
    for n in (int(float(v)) for v in args.sizes.split(",")):
        rows = [
            ("Feistel", measure(feistel, n, args.batch, 1)),
            (f"Feistel, {args.ranks} ranks", measure(feistel, n, args.batch, args.ranks)),
        ]
        if n <= args.peer_max:
            rows.append(
                ("materialised permutation (peer)", measure(materialised, n, args.batch, 1))
            )
        for name, m in rows:
            print(
                f"| {n:.0e} | {name} | {m['restore_s']:.4f} | {m['memory_mb']:.2f} | "
                f"{m['plan_ms_per_rank']:.3f} |"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
