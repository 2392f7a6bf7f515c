"""Training steps/s under OpenMP's wait policies: what ``OMP_WAIT_POLICY=PASSIVE`` (which
``vfm_core`` sets on import when the machine is busy: vfm_core/openmp.py) buys on a shared
machine, and what it would cost on an idle one.

    .venv/bin/python benchmarks/omp_wait.py [--rounds 2] [--steps 20] [--load 0]

Contestants, each a fresh process (the policy is read when torch loads its OpenMP runtime),
interleaved for ``--rounds`` rounds: the tokenizer stage's step (tok-tiny, 5 frames of 32x32,
batch 4, as ``make demo``'s tokenizer stage) and a dit-tiny step (batch 8, 5x8x8 latents), each at
torch's default threads under PASSIVE and under the OpenMP default (spin, then sleep), at one
thread under each, and under vfm's rule (vfm_core imported first: it picks the policy from the load
average and the threads from the CPUs other work keeps busy, vfm_core/openmp.py; the threads it
chose are printed). The
tokenizer's rows also give its counted FLOP/s (the step's FLOPs from torch's FlopCounterMode).
``--load N`` starts N busy-looping processes beside them for the run (a shared machine); the table
gives the load average at the start and the median steps/s of each.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

CHILD = """
import sys, time
threads, model, steps = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
if threads < 0:  # vfm's rule: vfm_core chooses the policy and the threads before torch loads
    import vfm_core
import torch
if threads > 0:
    torch.set_num_threads(threads)
print("threads", torch.get_num_threads())
if model == "tok-tiny":
    from vfm_core.tokenizer import get_tokenizer_config, synthetic_clips, train_tokenizer
    clips = [synthetic_clips(4, frames=5, size=32, seed=i) for i in range(4)]
    cfg = get_tokenizer_config("tok-tiny")
    train_tokenizer(cfg, clips, steps=3, progress=False)  # warm-up
    _, m = train_tokenizer(cfg, clips, steps=steps, progress=False)
    print(m.steps / m.seconds, m.train_flops_per_s)
    sys.exit()
else:
    from vfm_core.config import apply_overrides
    from vfm_core.recipes import get_recipe
    from vfm_core.train.trainer import Trainer
    sets = ["data.batch_size=8", "data.latent_frames=5", "data.latent_height=8",
            "data.latent_width=8", "tracking.mlflow=false"]
    tr = Trainer(apply_overrides(get_recipe("dit-tiny"), sets))
    for _ in range(3):
        tr.train_step(tr.source.next_batch())
    t = time.perf_counter()
    for _ in range(steps):
        tr.train_step(tr.source.next_batch())
print(steps / (time.perf_counter() - t), 0.0)
"""

CONTESTANTS = (  # (label, OMP_WAIT_POLICY or None for OpenMP's default, threads: 0 = torch's,
    # -1 = vfm's rule: the policy and the threads vfm_core chooses on import, vfm_core/openmp.py)
    ("vfm's rule (vfm_core/openmp.py)", None, -1),
    ("PASSIVE, 1 thread", "PASSIVE", 1),
    ("PASSIVE, all threads", "PASSIVE", 0),
    ("OpenMP default", None, 0),
    ("1 thread, spinning", None, 1),
)


def steps_per_s(
    model: str, policy: str | None, threads: int, steps: int
) -> tuple[float, float, int]:
    """(steps/s, FLOP/s: the tokenizer's counted FLOPs, 0 for dit-tiny; torch's threads) of a
    fresh process."""
    drop = ("OMP_WAIT_POLICY", "OMP_NUM_THREADS", "VFM_OMP_WAIT")  # vfm's rule decides afresh
    env = {k: v for k, v in os.environ.items() if k not in drop}
    if policy:  # else OpenMP's default: the child imports torch before vfm_core sets PASSIVE
        env["OMP_WAIT_POLICY"] = policy
    env["PYTHONPATH"] = str(REPO)
    out = subprocess.run(
        [sys.executable, "-c", CHILD, str(threads), model, str(steps)],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    )
    lines = out.stdout.strip().splitlines()
    used = next(int(x.split()[1]) for x in lines if x.startswith("threads "))
    rate, flops = lines[-1].split()
    return float(rate), float(flops), used


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--load", type=int, default=0, help="busy processes started beside the run")
    args = ap.parse_args()
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.load)]
    try:
        time.sleep(2 if hogs else 0)
        load = os.getloadavg()[0]
        got: dict[tuple[str, str], list[tuple[float, float, int]]] = {}
        for _ in range(args.rounds):
            for model in ("tok-tiny", "dit-tiny"):
                for label, policy, threads in CONTESTANTS:
                    rate = steps_per_s(model, policy, threads, args.steps)
                    got.setdefault((model, label), []).append(rate)
    finally:
        for h in hogs:
            h.kill()
    print(f"load average at start {load:.1f} on {os.cpu_count()} CPUs, {args.load} busy processes")
    print(
        f"{'model':<10} {'contestant':<34} {'threads':>7} {'steps/s':>8} {'GFLOP/s':>8}"
        f" {'vs default':>10}"
    )
    for model in ("tok-tiny", "dit-tiny"):
        base = statistics.median(r for r, _, _ in got[(model, "OpenMP default")])
        for label, _, _ in CONTESTANTS:
            runs = got[(model, label)]
            rate = statistics.median(r for r, _, _ in runs)
            flops = statistics.median(f for _, f, _ in runs) / 1e9
            used = "/".join(sorted({str(t) for _, _, t in runs}))
            shown = f"{flops:8.1f}" if flops else f"{'-':>8}"
            print(f"{model:<10} {label:<34} {used:>7} {rate:>8.2f} {shown} {rate / base:>9.2f}x")


if __name__ == "__main__":
    main()
