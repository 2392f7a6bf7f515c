"""LoRA fine-tuning vs full fine-tuning: trainable parameters, checkpoint size, peak memory and
step time, measured here on CPU and predicted by the planner at paper scale.

    .venv/bin/python benchmarks/lora.py [--steps 6] [--hidden 512] [--depth 6] [--rank 8]

**Measured (CPU, one process each).** A base DiT (``--hidden``, ``--depth``) is trained 2 steps;
then each mode starts from it (``vfm train --init``) and trains ``--steps`` steps, in its own
process so the peak resident memory (``ru_maxrss``, the ``peak_mem_gb`` of its metrics) is its
own. The peer is full fine-tuning of
the same model, data and steps. Columns: trainable parameters, checkpoint bytes (what a run
writes per checkpoint), peak RSS, median step time.

**Planned (H100s).** ``vfm plan`` of dit-7b at 8192 tokens on 32 GPUs, at the full fine-tuning
run's top layout, with and without rank-``--rank`` adapters: predicted memory per GPU and step
time (LoRA computes no gradient of the frozen weights, keeps no optimizer state or EMA of them
and reduce-scatters only the adapters' gradients).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def measured(args: argparse.Namespace, root: Path) -> list[dict]:
    from vfm_core.checkpoints.read import trained_params

    size = [f"model.hidden={args.hidden}", f"model.depth={args.depth}", "model.heads=8"]
    size += ["data.batch_size=4", "tracking.mlflow=false", "train.device=cpu"]
    base = root / "base"
    _train(base, [*size, "train.steps=2", "optim.lr=0.003"])
    rows = []
    for mode, extra in (
        ("full fine-tuning (peer)", []),
        (f"LoRA rank {args.rank}", [f"train.lora.rank={args.rank}"]),
    ):
        out = root / mode.split()[0].lower()
        sets = [*size, f"train.steps={args.steps}", f"train.init={base}", "optim.lr=0.001"]
        _train(out, [*sets, *extra])
        metrics = [json.loads(line) for line in (out / "metrics.jsonl").open()]
        (ckpt,) = (out / "checkpoints").iterdir()
        state = json.loads((ckpt / "state.json").read_text())
        rows.append(
            {
                "mode": mode,
                "trainable": trained_params(ckpt),
                "params": state["meta"].get("params") or "",
                "checkpoint_mb": sum(f.stat().st_size for f in ckpt.iterdir()) / 1e6,
                "peak_rss_gb": max(m["peak_mem_gb"] for m in metrics),  # the child's own
                "step_s": statistics.median(m["step_time"] for m in metrics[1:] or metrics),
                "loss": metrics[-1]["loss"],
            }
        )
    return rows


def _train(out: Path, sets: list[str]) -> None:
    """``vfm train`` with ``sets`` in a child process (its metrics record its own peak RSS)."""
    argv = [sys.executable, "-m", "vfm_core.cli", "train", "--out", str(out)]
    steps = next(s.split("=", 1)[1] for s in sets if s.startswith("train.steps="))
    argv += ["--steps", steps, *(a for s in sets for a in ("--set", s))]
    subprocess.run(argv, check=True, cwd=REPO, capture_output=True, text=True)


def planned(rank: int) -> list[dict]:
    from vfm_core.perf.layout_rules import LAYOUT_KEYS
    from vfm_core.perf.planner import plan
    from vfm_core.recipes import get_recipe

    model = get_recipe("dit-7b").model
    full = plan(model, seq_len=8192, gpus=32).plans[0]
    pins = {k: getattr(full.layout, k) for k in LAYOUT_KEYS}
    lora = plan(model, seq_len=8192, gpus=32, fixed=pins, lora_rank=rank).plans[0]
    out = []
    for mode, p in (("full fine-tuning (peer)", full), (f"LoRA rank {rank}", lora)):
        m = p.memory
        states = m.params_gib + m.grads_gib + m.optimizer_gib + m.ema_gib
        out.append(
            {"mode": mode, "mem_gib": m.total_gib, "states_gib": states, "step_s": p.time.step_s}
        )
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--depth", type=int, default=6)
    ap.add_argument("--rank", type=int, default=8)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="vfm-lora-bench-") as tmp:
        rows = measured(args, Path(tmp))
    print(f"measured on CPU: DiT hidden {args.hidden}, depth {args.depth}, {args.steps} steps")
    print(f"{'mode':26} {'trainable':>11} {'ckpt MB':>8} {'peak RSS GiB':>12} {'step s':>7}")
    for r in rows:
        print(
            f"{r['mode']:26} {r['trainable']:>11,} {r['checkpoint_mb']:>8.1f} "
            f"{r['peak_rss_gb']:>12.2f} {r['step_s']:>7.3f}"
        )
    full, lora = rows
    print(
        f"LoRA / full: trainable {lora['trainable'] / full['trainable']:.4f}x, checkpoint "
        f"{lora['checkpoint_mb'] / full['checkpoint_mb']:.3f}x, peak RSS "
        f"{lora['peak_rss_gb'] / full['peak_rss_gb']:.2f}x, step time "
        f"{lora['step_s'] / full['step_s']:.2f}x"
    )
    plans = planned(args.rank)
    print("\nplanned: dit-7b, 8192 tokens, 32 x H100, the full run's top layout")
    print(f"{'mode':26} {'mem GiB':>8} {'states GiB':>10} {'step s':>8}")
    for r in plans:
        print(f"{r['mode']:26} {r['mem_gib']:>8.1f} {r['states_gib']:>10.1f} {r['step_s']:>8.2f}")
    a, b = plans
    print(
        f"LoRA / full: memory {b['mem_gib'] / a['mem_gib']:.2f}x, states "
        f"{b['states_gib'] / a['states_gib']:.2f}x, step time {b['step_s'] / a['step_s']:.2f}x"
    )


if __name__ == "__main__":
    main()
