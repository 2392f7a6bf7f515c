"""CPU MFU of training steps and AdaLN vs AdaLN-LoRA step time.

    .venv/bin/python benchmarks/train_step.py [--steps 6] [--widths 256,512,768,1024]

For each row: a Trainer on synthetic latents, warm-up steps, then timed steps. MFU = achieved model
FLOP/s (analytic, vfm_core.perf.flops) ÷ measured fp32 GEMM FLOP/s at the model's width, both in
this run (vfm_core.perf.hardware.measure_cpu_peak). The AdaLN rows compare step time of AdaLN-Zero
and
AdaLN-LoRA at the same width (the paper reports up to 1.2× on GPU).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch

from vfm_core.config import apply_overrides
from vfm_core.perf.hardware import measure_cpu_peak
from vfm_core.recipes import get_recipe
from vfm_core.train.trainer import Trainer


def measure(recipe: str, overrides: list[str], steps: int, warmup: int = 2) -> dict:
    cfg = apply_overrides(
        get_recipe(recipe), overrides + ["tracking.mlflow=false", "train.ema_decay=0"]
    )
    tr = Trainer(cfg)
    for _ in range(warmup):
        tr.train_step(tr.source.next_batch())
    times = []
    for _ in range(steps):
        batch = tr.source.next_batch()
        t0 = time.perf_counter()
        tr.train_step(batch)
        times.append(time.perf_counter() - t0)
    dt = statistics.median(times)
    # the CPU peak drifts with the machine's load: measure again right after the steps and take
    # the larger of the two (the conservative choice for MFU)
    peak = max(tr.peak_flops, measure_cpu_peak(cfg.model.hidden, seconds=2.0))
    tokens = cfg.data.batch_size * tr.tokens_per_sample
    achieved = tokens / dt * tr.flops_per_token
    return {
        "width": cfg.model.hidden,
        "depth": cfg.model.depth,
        "adaln": cfg.model.adaln,
        "params_m": tr.params / 1e6,
        "tokens": tokens,
        "step_s": dt,
        "tflops": achieved / 1e12,
        "peak_tflops": peak / 1e12,
        "mfu": achieved / peak,
    }


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--widths", default="512,768,1024")
    args = ap.parse_args()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, CPU fp32")
    rows = [("dit-tiny", measure("dit-tiny", [], args.steps))]
    for w in map(int, args.widths.split(",")):
        heads = w // 64
        common = [f"model.hidden={w}", f"model.heads={heads}", "model.depth=4", "data.batch_size=8"]
        for adaln in ("zero", "lora"):
            rows.append(
                (
                    f"w{w}-{adaln}",
                    measure("dit-tiny", common + [f"model.adaln={adaln}"], args.steps),
                )
            )
    hdr = (
        f"{'run':14s} {'width':>5s} {'adaln':>5s} {'params':>8s} {'tokens':>6s} "
        f"{'step s':>7s} {'GFLOP/s':>8s} {'peak':>8s} {'MFU':>6s}"
    )
    print(hdr)
    print("-" * len(hdr))
    for name, r in rows:
        print(
            f"{name:14s} {r['width']:5d} {r['adaln']:>5s} {r['params_m']:7.1f}M {r['tokens']:6d} "
            f"{r['step_s']:7.3f} {r['tflops'] * 1e3:8.1f} {r['peak_tflops'] * 1e3:8.1f} "
            f"{r['mfu']:6.1%}"
        )
    print("\nAdaLN-Zero vs AdaLN-LoRA step time at the same width (ratio > 1: LoRA faster)")
    by = {name: r for name, r in rows}
    for w in map(int, args.widths.split(",")):
        z, lo = by[f"w{w}-zero"], by[f"w{w}-lora"]
        print(
            f"  width {w}: zero {z['step_s']:.3f}s  lora {lo['step_s']:.3f}s  "
            f"ratio {z['step_s'] / lo['step_s']:.3f}  (params {z['params_m']:.1f}M vs "
            f"{lo['params_m']:.1f}M)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
