"""Scale-out benchmark of the one trainer (issue #13), on this machine's CPU cores with gloo:

1. time per step of the same run (dit-tiny, global batch 4) in 1 process, in 2 processes on one
   node (TP2) and as 2 "nodes" of one process each (TP2, c10d rendezvous on 127.0.0.1); the loss
   of every step must agree (the one-trainer contract). Bytes per rank are those of the TP2(+SP)
   row of ``benchmarks/parallel.py``: a node boundary changes where they travel, not how many.
2. restart cost: a ``--max-restarts 1`` run with a rank SIGKILLed after step 3; the time from the
   kill to the next completed step (torchrun notices, restarts every rank, they rebuild the model,
   load the last checkpoint and train one step).

Times on 2 shared CPU cores are context, not GPU predictions. Usage::

    .venv/bin/python benchmarks/scaleout.py [--steps 12] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SMALL = ["model.depth=2", "data.batch_size=4", "optim.warmup_steps=1", "optim.lr=0.002"]


def vfm_train(out: Path, steps: int, *extra: str) -> list[str]:
    sets = [a for s in SMALL for a in ("--set", s)]
    return [
        sys.executable,
        "-m",
        "vfm_core.cli",
        "train",
        "--recipe",
        "dit-tiny",
        "--steps",
        str(steps),
        "--seed",
        "1",
        "--no-mlflow",
        "--out",
        str(out),
        *sets,
        *extra,
    ]


def env() -> dict:
    return {**os.environ, "OMP_NUM_THREADS": "1"}


def rows(out: Path) -> list[dict]:
    path = out / "metrics.jsonl"
    return (
        [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.exists() else []
    )


def run(argv: list[str]) -> None:
    proc = subprocess.run(argv, capture_output=True, text=True, env=env())
    if proc.returncode:
        sys.exit(f"failed: {' '.join(argv)}\n{proc.stderr[-2000:]}")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def layouts(root: Path, steps: int) -> list[tuple[str, list[dict]]]:
    out = []
    run(vfm_train(root / "one", steps))
    out.append(("1 process", rows(root / "one")))
    run(vfm_train(root / "tp2", steps, "--nproc", "2", "--tp", "2"))
    out.append(("2 processes, 1 node, TP2", rows(root / "tp2")))
    port, nodes = free_port(), root / "nodes"
    node = ["--tp", "2", "--nnodes", "2", "--rdzv-endpoint", f"127.0.0.1:{port}"]
    joiner = subprocess.Popen(
        vfm_train(nodes, steps, *node, "--node-rank", "1"),
        env=env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    run(vfm_train(nodes, steps, *node, "--node-rank", "0"))
    joiner.wait(timeout=300)
    out.append(("2 nodes x 1 process, TP2", rows(nodes)))
    return out


def restart_cost(root: Path, steps: int) -> tuple[float, int]:
    """Seconds from the SIGKILL to the next completed step, and the step it resumed from."""
    out = root / "elastic"
    job = subprocess.Popen(
        vfm_train(
            out,
            steps,
            "--nproc",
            "2",
            "--dp-shard",
            "2",
            "--max-restarts",
            "1",
            "--set",
            "train.ckpt_every=2",
        ),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env(),
    )
    while len(rows(out)) < 3:
        if job.poll() is not None:
            sys.exit("the elastic run ended before step 3")
        time.sleep(0.05)
    pids = []
    for proc in Path("/proc").iterdir():
        try:
            args = (proc / "cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue
        if (
            "vfm_core.train.main" in args
            and str(out) in args
            and "torch.distributed.run" not in args
        ):
            pids.append(int(proc.name))
    killed_at, before = time.monotonic(), len(rows(out))
    os.kill(max(pids), signal.SIGKILL)
    resumed_from = None
    while True:  # the restarted ranks truncate metrics.jsonl to the checkpoint, then append
        r = rows(out)
        if resumed_from is None and len(r) < before:
            resumed_from = r[-1]["step"] if r else 0
        if resumed_from is not None and len(r) > resumed_from:
            cost = time.monotonic() - killed_at
            break
        if job.poll() is not None:
            sys.exit("the elastic run ended without a restart")
        time.sleep(0.05)
    job.wait(timeout=300)
    return cost, resumed_from


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--out", help="keep the runs here (default: a temporary folder)")
    args = ap.parse_args()
    root = Path(args.out or tempfile.mkdtemp(prefix="vfm-scaleout-"))
    results = layouts(root, args.steps)
    ref = [r["loss"] for r in results[0][1]]
    print(
        "| layout | ranks | median step s (after 2) | tokens/s | max rel. loss diff vs 1 process |"
    )
    print("|---|---|---|---|---|")
    for name, rs in results:
        t = statistics.median(r["step_time"] for r in rs[2:])
        tok = statistics.median(r["tokens_per_s"] for r in rs[2:])
        diff = max(abs(r["loss"] - w) / abs(w) for r, w in zip(rs, ref, strict=True))
        ranks = 1 if name.startswith("1 ") else 2
        print(f"| {name} | {ranks} | {t:.3f} | {tok:.0f} | {diff:.1e} |")
    cost, step = restart_cost(root, args.steps)
    print(
        f"\nrestart cost (SIGKILL of one of 2 ranks -> next completed step, resumed from step "
        f"{step}): {cost:.1f} s"
    )


if __name__ == "__main__":
    main()
