"""Parallel training: bytes communicated and step time per layout, and the paper's CP volume table.

    .venv/bin/python benchmarks/parallel.py [--steps 3] [--skip-measured]

1. **Measured (CPU, gloo)**: one training step of the trainer (every microbatch's fwd + bwd,
   gradient sync, clip, AdamW, EMA) of ``dit-tiny`` (256 tokens, hidden 256, depth 4, fp32) /
   ``stdit-tiny`` on the same global batch of 4 for each layout, 1D to the 4D TP x SP x CP x PP on
   8 ranks; bytes each rank sends per step (counted on every c10d collective by ``CommCounter``)
   and the median step time.
   Gloo on 2 shared cores is not a speed test: read the bytes, take the time as context only.
2. **Ring overlap (CPU, gloo)**: the packed ring's attention fwd + bwd alone (a pack of 700-token
   samples), the next K/V block moving while the current block is computed vs. send-wait-compute,
   same numbers (bitwise, tests/parallel/test_context.py); median time of each, one thread per rank.
3. **On paper**: per attention layer (fwd + bwd, bf16, per rank) bytes of ring P2P vs all-to-all
   context parallelism for ST-DiT spatial / temporal and full attention at the paper's shapes
   (b=1, 16 x 44 x 80 = 56,320 tokens), with the attention compute per rank and the H100 NVLink
   time — the numbers the hybrid (all-to-all for spatial/temporal, ring for full) rests on.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "parallel"))
from parallel_harness import run_ranks  # noqa: E402  (the tests' one spawning harness)

from vfm_core.parallel.comm_stats import alltoall_bytes, ring_bytes  # noqa: E402
from vfm_core.perf.hardware import PEAKS  # noqa: E402

GLOBAL_BATCH = 4
LAYOUTS = [  # (label, recipe, world, degrees, parallel settings)
    ("1 process", "dit-tiny", 1, {}, {}),
    ("FSDP2", "dit-tiny", 2, dict(dp_shard=2), {}),
    ("TP2", "dit-tiny", 2, dict(tp=2), dict(sequence_parallel=False)),
    ("TP2+SP", "dit-tiny", 2, dict(tp=2), dict(sequence_parallel=True)),
    ("CP2 ring", "dit-tiny", 2, dict(cp=2), dict(cp_mode="ring")),
    ("CP2 all-to-all", "dit-tiny", 2, dict(cp=2), dict(cp_mode="alltoall")),
    ("ST-DiT 1 process", "stdit-tiny", 1, {}, {}),
    ("ST-DiT CP2 hybrid", "stdit-tiny", 2, dict(cp=2), dict(cp_mode="hybrid")),
    ("FSDP2 x TP2+SP", "dit-tiny", 4, dict(dp_shard=2, tp=2), {}),
    ("TP2+SP x CP2 ring", "dit-tiny", 4, dict(tp=2, cp=2), dict(cp_mode="ring")),
    ("PP2 (1F1B, 2 microbatches)", "dit-tiny", 2, dict(pp=2), {}),
    (
        "PP2 interleaved (v=2)",
        "dit-tiny",
        2,
        dict(pp=2),
        dict(pp_schedule="interleaved_1f1b", pp_virtual_stages=2),
    ),
    ("PP2 x FSDP2", "dit-tiny", 4, dict(pp=2, dp_shard=2), {}),
    ("PP2 x TP2+SP", "dit-tiny", 4, dict(pp=2, tp=2), {}),
    ("PP2 x CP2 ring", "dit-tiny", 4, dict(pp=2, cp=2), dict(cp_mode="ring")),
    ("4D: TP2+SP x CP2 x PP2", "dit-tiny", 8, dict(tp=2, cp=2, pp=2), dict(cp_mode="ring")),
]


def _step_worker(rank, world, recipe, degrees, settings, steps):
    """One training step of the trainer (forward + backward of every microbatch, gradient sync,
    clip, AdamW, EMA) on the global batch of 4 under the layout."""
    import dataclasses

    from vfm_core.config import ParallelConfig, apply_overrides
    from vfm_core.parallel.comm_stats import CommCounter
    from vfm_core.recipes import get_recipe
    from vfm_core.train.trainer import Trainer

    cfg = apply_overrides(
        get_recipe(recipe),
        [f"data.batch_size={GLOBAL_BATCH}", "train.device=cpu", "tracking.mlflow=false"],
    )
    layout = dataclasses.replace(ParallelConfig(), **{"dp_shard": 1, **degrees, **settings})
    trainer = Trainer(dataclasses.replace(cfg, parallel=layout))
    batch = trainer.source.next_batch()
    trainer.train_step(batch)  # warm-up (and the pipeline's shape inference)
    with CommCounter() as counter:
        trainer.train_step(batch)
    times = []
    for _ in range(steps):
        torch.distributed.barrier()
        t0 = time.perf_counter()
        trainer.train_step(batch)
        times.append(time.perf_counter() - t0)
    return {"bytes": counter.bytes, "by_op": dict(counter.by_op), "time": statistics.median(times)}


def measured(steps: int) -> list[dict]:
    rows = []
    for label, recipe, world, degrees, options in LAYOUTS:
        res = run_ranks(_step_worker, world, recipe, degrees, options, steps)
        ops: dict[str, float] = {}
        for r in res:
            for k, v in r["by_op"].items():
                ops[k] = ops.get(k, 0.0) + v / world
        rows.append(
            {
                "layout": label,
                "ranks": world,
                "mb_per_rank": max(r["bytes"] for r in res) / 2**20,
                "ops": {k: round(v / 2**20, 3) for k, v in sorted(ops.items())},
                "step_s": max(r["time"] for r in res),
            }
        )
        print(
            f"  {label}: {rows[-1]['mb_per_rank']:.2f} MiB/rank, {rows[-1]['step_s']:.3f} s",
            file=sys.stderr,
        )
    return rows


def _overlap_worker(rank, world, tokens, heads, dim, steps):
    from vfm_core.parallel.context import ring_attention

    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(rank)
    q, k, v = (torch.randn(1, heads, tokens // world, dim, generator=g) for _ in range(3))
    ids = torch.arange(tokens) // 700  # a pack: the ring with overlap is ours (PyTorch's ring,
    # for unpacked attention, issues its transfers asynchronously itself)
    res = {}
    for overlap in (False, True, False, True):  # interleaved: load drifts hit both alike
        times = []
        for _ in range(steps):
            loc = [t.clone().requires_grad_() for t in (q, k, v)]
            torch.distributed.barrier()
            t0 = time.perf_counter()
            out = ring_attention(
                *loc, torch.distributed.group.WORLD, sample_ids=ids, overlap=overlap
            )
            out.sum().backward()
            times.append(time.perf_counter() - t0)
        res.setdefault(overlap, []).extend(times)
    return {str(o): statistics.median(t) for o, t in res.items()}


def overlap_rows(steps: int, tokens: int = 4096, heads: int = 4, dim: int = 64) -> list[dict]:
    rows = []
    for world in (2, 4):
        res = run_ranks(_overlap_worker, world, tokens, heads, dim, steps)
        seq = max(r["False"] for r in res)
        ovl = max(r["True"] for r in res)
        kv_mib = 2 * heads * (tokens // world) * dim * 4 / 2**20
        rows.append(
            {
                "cp": world,
                "tokens": tokens,
                "kv_block_mib": kv_mib,
                "sequential_s": seq,
                "overlap_s": ovl,
                "speedup": seq / ovl,
            }
        )
        print(f"  ring overlap cp={world}: {seq:.3f} s -> {ovl:.3f} s", file=sys.stderr)
    return rows


def paper_table(hidden: int = 5120, heads: int = 40) -> list[dict]:
    """stdit-12b width; b=1, t=16, h*w=44*80 latent tokens; bf16; H100 SXM."""
    h100 = PEAKS["H100 SXM"]
    link = h100.nvlink_gbps / 2 * 1e9  # bytes/s one direction
    peak = h100.bf16_tflops * 1e12
    b, t, hw = 1, 16, 44 * 80
    n = t * hw
    rows = []
    for cp in (2, 4, 8):
        ring = ring_bytes(b=b, tokens=n, dim_kv=hidden, cp=cp)
        a2a = alltoall_bytes(b=b, tokens=n, dim=hidden, dim_kv=hidden, cp=cp)
        for layout, group in (("spatial", hw), ("temporal", t), ("full", n)):
            # QK^T and PV: 4 * b * N * group * D forward, x3 with backward, split over cp ranks
            flops = 3 * 4 * b * n * group * hidden / cp
            rows.append(
                {
                    "layout": layout,
                    "cp": cp,
                    "ring_mb": ring / 2**20,
                    "a2a_mb": a2a / 2**20,
                    "ring_over_a2a": ring / a2a,
                    "compute_ms": flops / peak * 1e3,
                    "ring_ms": ring / link * 1e3,
                    "a2a_ms": a2a / link * 1e3,
                }
            )
    return rows


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--skip-measured", action="store_true")
    ap.add_argument("--skip-overlap", action="store_true")
    ap.add_argument("--json", help="also write the rows to this JSON file")
    args = ap.parse_args()
    out: dict = {}
    if not args.skip_measured:
        out["measured"] = measured(args.steps)
        print(
            "\n| layout | ranks | MiB sent / rank / step | by collective (MiB, mean/rank) | "
            "step s (CPU, context only) |\n|---|---|---|---|---|"
        )
        for r in out["measured"]:
            ops = ", ".join(f"{k} {v}" for k, v in r["ops"].items()) or "-"
            print(
                f"| {r['layout']} | {r['ranks']} | {r['mb_per_rank']:.2f} | {ops} | "
                f"{r['step_s']:.3f} |"
            )
    if not args.skip_overlap:
        out["overlap"] = overlap_rows(max(args.steps, 3))
        print(
            "\n| ring attention fwd+bwd | tokens | K/V block MiB | send-wait-compute s | "
            "overlapped s | speed-up |\n|---|---|---|---|---|---|"
        )
        for r in out["overlap"]:
            print(
                f"| cp={r['cp']} | {r['tokens']} | {r['kv_block_mib']:.2f} | "
                f"{r['sequential_s']:.3f} | {r['overlap_s']:.3f} | {r['speedup']:.2f}x |"
            )
    out["paper"] = paper_table()
    print(
        "\nPer attention layer, fwd+bwd, bf16, per rank; stdit-12b width 5120; b=1, "
        "16x44x80 = 56,320 tokens; H100 SXM: 989 TFLOP/s dense bf16, NVLink 450 GB/s per "
        "direction.\n"
    )
    print(
        "| attention | cp | ring MiB | all-to-all MiB | ring / a2a | attn compute ms | "
        "ring comm ms | a2a comm ms |\n|---|---|---|---|---|---|---|---|"
    )
    for r in out["paper"]:
        print(
            f"| {r['layout']} | {r['cp']} | {r['ring_mb']:.0f} | {r['a2a_mb']:.0f} | "
            f"{r['ring_over_a2a']:.2f} | {r['compute_ms']:.3f} | {r['ring_ms']:.3f} | "
            f"{r['a2a_ms']:.3f} |"
        )
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
