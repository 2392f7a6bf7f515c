"""The autoregressive family on CPU: training MFU at width >= 512, generation tokens/s with and
without the KV cache, held-out bits per token trained vs untrained, causal ring CP work and bytes
per rank with and without load balancing.

    .venv/bin/python benchmarks/autoregressive.py [--steps 6] [--train-steps 150]

MFU: a Trainer step of ar-tiny widened to 512 / 768 (same method as benchmarks/train_step.py:
analytic model FLOPs, causal attention counted once, over the measured fp32 GEMM peak at that
width). Generation: ar-tiny, one 3x8x8 video (192 tokens), greedy; the uncached sampler reruns the
whole prefix every token (the peer). Bits per token: next-token cross-entropy / ln 2 on 32 held-
out synthetic videos (same captions, positions never trained on) for the untrained init and after
``--train-steps``. Causal ring CP (ar-4b's 12,800 tokens, bf16 K/V): attention (query, key)
pairs each rank computes (contiguous chunks vs the balanced zigzag placement; the slowest rank
sets the step time) and the K/V bytes it sends per layer (the same for both placements).
"""

from __future__ import annotations

import argparse
import math
import statistics
import time

import torch

from vfm_core.config import apply_overrides
from vfm_core.infer.ar_sample import SamplingConfig, sample_tokens
from vfm_core.infer.evaluate import EvalConfig, heldout_bits
from vfm_core.parallel.comm_stats import ring_bytes
from vfm_core.parallel.context import causal_positions
from vfm_core.perf.hardware import measure_cpu_peak
from vfm_core.recipes import get_recipe
from vfm_core.tokenizer.synthetic_tokens import SyntheticTokens
from vfm_core.train.trainer import Trainer

BASE = ["tracking.mlflow=false", "train.ema_decay=0"]


def mfu_row(width: int, steps: int) -> dict:
    cfg = apply_overrides(
        get_recipe("ar-tiny"),
        [
            *BASE,
            f"model.hidden={width}",
            f"model.heads={width // 64}",
            f"model.kv_heads={width // 128}",
            "data.batch_size=4",
        ],
    )
    tr = Trainer(cfg)
    for _ in range(2):
        tr.train_step(tr.source.next_batch())
    times = []
    for _ in range(steps):
        batch = tr.source.next_batch()
        t0 = time.perf_counter()
        tr.train_step(batch)
        times.append(time.perf_counter() - t0)
    dt = statistics.median(times)
    peak = max(tr.peak_flops, measure_cpu_peak(width, seconds=2.0))
    achieved = cfg.data.batch_size * tr.tokens_per_sample / dt * tr.flops_per_token
    return {
        "width": width,
        "params_m": tr.params / 1e6,
        "step_s": dt,
        "gflops": achieved / 1e9,
        "peak_gflops": peak / 1e9,
        "mfu": achieved / peak,
    }


@torch.no_grad()
def bits_per_token(model, cfg) -> float:
    held = apply_overrides(cfg, ["data.batch_size=32"])
    src = SyntheticTokens(held.data, held.model)
    src.load_state_dict({**src.state_dict(), "position": 10**7})  # far past anything trained on
    batch = src.next_batch()
    m = heldout_bits(model, cfg, batch.values, batch.text, EvalConfig(batch=32))
    return m["heldout_bits_per_token"]


def cp_rows(tokens: int = 12800, kv_dim: int = 8 * 128) -> list[dict]:
    rows = []
    for cp in (2, 4, 8):
        row = {"cp": cp, "mb_per_layer": ring_bytes(b=1, tokens=tokens, dim_kv=kv_dim, cp=cp) / 1e6}
        for balanced in (False, True):
            pos = causal_positions(tokens // cp, cp, balanced=balanced)
            # (q, k) pairs with k <= q of each rank's queries: sum over its positions of (q + 1)
            work = [int((pos[r] + 1).sum()) for r in range(cp)]
            row["balanced" if balanced else "contiguous"] = max(work) / min(work)
        rows.append(row)
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=6, help="timed training steps per width")
    ap.add_argument("--train-steps", type=int, default=150, help="steps before bits per token")
    args = ap.parse_args()
    torch.set_num_threads(max(1, torch.get_num_threads()))

    print("| width | params | step s | GFLOP/s | CPU peak GFLOP/s | MFU |")
    print("|---:|---:|---:|---:|---:|---:|")
    for width in (512, 768):
        r = mfu_row(width, args.steps)
        print(
            f"| {r['width']} | {r['params_m']:.1f}M | {r['step_s']:.3f} | {r['gflops']:.1f} | "
            f"{r['peak_gflops']:.1f} | {100 * r['mfu']:.1f}% |"
        )

    cfg = apply_overrides(
        get_recipe("ar-tiny"),
        [*BASE, "data.batch_size=8", "optim.lr=0.003", f"train.steps={args.train_steps}"],
    )
    tr = Trainer(cfg)
    model = tr.model.eval()
    untrained = bits_per_token(model, cfg)
    text = SyntheticTokens(cfg.data, cfg.model).next_batch().text[:1]
    grid = (cfg.data.latent_frames, cfg.data.latent_height, cfg.data.latent_width)
    rows = []
    for cache in (True, False):
        t0 = time.perf_counter()
        sample_tokens(model, text, grid, SamplingConfig(temperature=0.0, use_cache=cache))
        rows.append((cache, math.prod(grid) / (time.perf_counter() - t0)))
    print("\n| generation (192 tokens, greedy) | tokens/s |")
    print("|---|---:|")
    for cache, tps in rows:
        print(f"| {'KV cache' if cache else 'no cache (rerun prefix)'} | {tps:.0f} |")
    print(f"| speed-up | {rows[0][1] / rows[1][1]:.1f}x |")

    print(
        "\n| causal ring CP, 12,800 tokens | K/V MB sent per rank per layer | work max/min "
        "rank, contiguous | work max/min rank, balanced |"
    )
    print("|---:|---:|---:|---:|")
    for r in cp_rows():
        print(
            f"| cp={r['cp']} | {r['mb_per_layer']:.1f} | {r['contiguous']:.2f}x | "
            f"{r['balanced']:.2f}x |"
        )

    model.train()
    for _ in range(args.train_steps):
        tr.train_step(tr.source.next_batch())
    trained = bits_per_token(tr.model.eval(), cfg)
    print(
        f"\n| held-out bits per token (vocab {cfg.model.vocab_size}, "
        f"uniform {math.log2(cfg.model.vocab_size):.2f}) | value |"
    )
    print("|---|---:|")
    print(f"| untrained | {untrained:.3f} |")
    print(f"| trained {args.train_steps} steps | {trained:.3f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
