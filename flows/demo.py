"""``make demo``: the pipeline on the built-in synthetic sample, on CPU, then where to look.

Today the chain is: synthetic latents -> train dit-tiny (Prefect flow + MLflow run). Curation,
shards, generation and report join as their stages land.
"""

from __future__ import annotations

import json
import os
import sys
import time

from flows.train import TrainParams, train_flow
from vfm_core.tracking import data_dir, ui_hint


def main() -> int:
    steps = int(os.environ.get("VFM_DEMO_STEPS", "300"))
    out = data_dir() / "runs" / f"demo-dit-tiny-{time.strftime('%Y%m%d-%H%M%S')}"
    params = TrainParams(
        recipe="dit-tiny",
        steps=steps,
        out_dir=str(out),
        overrides=["train.ckpt_every=100", "optim.lr=0.001"],
        experiment="vfm-demo",
    )
    summary = train_flow(params)
    m = summary["final"]
    rows = [json.loads(line) for line in (out / "metrics.jsonl").open()]
    k = max(1, len(rows) // 10)
    first = sum(r["loss"] for r in rows[:k]) / k
    last = sum(r["loss"] for r in rows[-k:]) / k
    print("\n" + "=" * 72)
    print(
        f"demo done: dit-tiny ({summary['params'] / 1e6:.1f}M params) trained "
        f"{summary['step']} steps on CPU"
    )
    print(f"  loss {first:.4f} (mean of first {k} steps) -> {last:.4f} (last {k})")
    print(
        f"  throughput {m['tokens_per_s']:.0f} tokens/s, {m['tflops'] * 1e3:.1f} GFLOP/s, "
        f"CPU MFU {m['mfu']:.1%}"
    )
    print(f"  metrics:     {out}/metrics.jsonl")
    print(f"  checkpoint:  {summary['checkpoint']}")
    print(f"  MLflow run:  {summary['mlflow_run_id']} (experiment vfm-demo)")
    print(f"  look at it:  {ui_hint()}")
    print("               then open http://127.0.0.1:5000")
    print("=" * 72)
    return 0


if __name__ == "__main__":
    sys.exit(main())
