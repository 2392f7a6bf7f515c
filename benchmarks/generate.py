"""Generation benchmark: tokenizer throughput + PSNR, trained vs untrained dit-tiny (held-out EDM
loss, Fréchet distance), and CP generation time / equivalence on 1 vs 2 processes.

    .venv/bin/python benchmarks/generate.py [--tok-minutes 2] [--dit-steps 300] [--out DIR]

1. **Tokenizer**: tok-tiny trained on synthetic moving shapes for ``--tok-minutes`` (the recipe of
   ``benchmarks/tokenizer.py``); encode/decode input frames/s at 13 frames (median of 3, no grad,
   batch 1) and PSNR on held-out 64x64 clips against the mean-colour baseline.
2. **Does the DiT learn**: dit-tiny (synthetic latents 4x16x16, 256 tokens) trained for
   ``--dit-steps`` with ``vfm train``'s :func:`run_training` (reused if ``OUT/dit-trained`` holds a
   finished run), and the same model at its initialisation (step 0, saved through the same
   checkpoint manager). Both evaluated (raw weights, inside the EMA horizon) with
   :func:`vfm_core.infer.evaluate.evaluate` on held-out samples (other data seed), logged to MLflow
   (experiment ``bench-generate``).
3. **CP generation**: ``vfm generate --nproc 1`` and ``--nproc 2`` (torchrun, gloo) of the trained
   DiT at 13 frames x 128x128 (latent 4x4x16x16, 256 tokens), 32 Heun steps, guidance 3, decoded
   with the trained tokenizer: denoising seconds and max abs difference of latents and videos. This
   machine has 2 cores shared with other work, so 2 ranks cannot show a real speed-up.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from vfm_core.checkpoints.manager import CheckpointManager
from vfm_core.config import apply_overrides, save_yaml, validate
from vfm_core.infer.evaluate import EvalConfig, evaluate, log_evaluation
from vfm_core.recipes import get_recipe
from vfm_core.tokenizer import (
    evaluate_psnr,
    get_tokenizer_config,
    load_tokenizer,
    synthetic_clips,
    train_tokenizer,
)
from vfm_core.train.main import run_training
from vfm_core.train.trainer import Trainer

ROOT = Path(__file__).resolve().parents[1]


def _tokenizer_bench():
    spec = importlib.util.spec_from_file_location("bench_tok", ROOT / "benchmarks/tokenizer.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.throughput


def tokenizer_section(out: Path, minutes: float) -> Path:
    cfg = get_tokenizer_config("tok-tiny")
    train = [synthetic_clips(8, frames=5, size=32, seed=i) for i in range(200)]
    held64 = [synthetic_clips(4, frames=9, size=64, seed=200_000 + i) for i in range(4)]
    _, probe = train_tokenizer(cfg, train, steps=4, progress=False)
    steps = max(10, int(minutes * 60 / (probe.seconds / probe.steps)))
    model, m = train_tokenizer(
        cfg,
        train,
        steps=steps,
        out_dir=out / "tokenizer",
        max_seconds=minutes * 90,
        progress=False,
    )
    p64, b64 = evaluate_psnr(model, held64)
    throughput = _tokenizer_bench()
    print("## tokenizer (tok-tiny, 4x8x8, 4 latent channels)\n")
    print(
        f"trained {m.steps} steps in {m.seconds:.0f} s; loss {m.loss_first:.4f} -> "
        f"{m.loss_last:.4f}\n"
    )
    print("| clip | encode frames/s | decode frames/s |")
    print("|---|---|---|")
    for size in (64, 128):
        enc, dec = throughput(model.eval(), 13, size, 3, 0)
        print(f"| 13 x {size}x{size} | {enc:.1f} | {dec:.1f} |")
    print("\n| held-out clips | PSNR (dB) | mean-colour baseline (dB) |")
    print("|---|---|---|")
    print(f"| 16 x 64x64, 9 frames | {p64:.2f} | {b64:.2f} |\n", flush=True)
    return out / "tokenizer"


def dit_section(out: Path, steps: int, tracking_experiment: str) -> Path:
    cfg = validate(
        apply_overrides(
            get_recipe("dit-tiny"),
            [
                f"train.steps={steps}",
                "train.ckpt_every=100000",
                "train.device=cpu",
                "train.log_every=50",
                f"tracking.experiment={tracking_experiment}",
            ],
        )
    )
    untrained = out / "dit-untrained"
    if not (out / "dit-trained" / "summary.json").is_file():  # rerun: reuse the trained run
        tr = Trainer(cfg)  # the same seed -> the very weights training starts from
        CheckpointManager(untrained).save(0, tr.state_dict(), meta=tr.meta())
        save_yaml(cfg, untrained / "config.yaml")
        t0 = time.perf_counter()
        summary = run_training(cfg, out_dir=out / "dit-trained", progress=False)
        summary["train_s"] = time.perf_counter() - t0
        (out / "dit-trained" / "summary.json").write_text(json.dumps(summary))
    summary = json.loads((out / "dit-trained" / "summary.json").read_text())
    train_s = summary.get("train_s", float("nan"))
    ec = EvalConfig(loss_samples=32, fd_samples=16, steps=8, batch=8)
    rows = {}
    for name, path in (
        ("untrained (step 0)", untrained),
        (f"trained ({steps} steps)", out / "dit-trained"),
    ):
        m = evaluate(path, config=ec)  # raw weights: 150-300 steps are inside the EMA horizon
        log_evaluation(m, tracking=cfg.tracking, params={"checkpoint": str(path), "which": name})
        rows[name] = m
    print(
        f"## dit-tiny: trained {steps} steps in {train_s:.0f} s "
        f"(final train loss {summary['metrics'].get('loss', float('nan')):.4f})\n"
    )
    sig = [f"loss_sigma_{s:g}" for s in ec.sigmas]
    print(
        "| checkpoint | held-out EDM loss (mean) | "
        + " | ".join(f"σ={s:g}" for s in ec.sigmas)
        + " | Fréchet distance |"
    )
    print("|---|---|" + "---|" * len(sig) + "---|")
    for name, m in rows.items():
        print(
            f"| {name} | {m['heldout_loss']:.4f} | "
            + " | ".join(f"{m[k]:.4f}" for k in sig)
            + f" | {m['frechet_distance']:.4f} |"
        )
    print(flush=True)
    return out / "dit-trained"


def cp_section(out: Path, run: Path, tok: Path) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    res = {}
    for n in (1, 2):
        mp4 = out / f"gen-{n}.mp4"
        t0 = time.perf_counter()
        p = subprocess.run(
            [
                sys.executable,
                "-m",
                "vfm_core.cli",
                "generate",
                "--checkpoint",
                str(run),
                "--prompt",
                "blob class 3",
                "--frames",
                "13",
                "--size",
                "128x128",
                "--seed",
                "0",
                "--steps",
                "32",
                "--guidance",
                "3",
                "--tokenizer",
                str(tok),
                "--out",
                str(mp4),
                "--nproc",
                str(n),
                "--json",
            ],
            capture_output=True,
            text=True,
            env=env,
        )
        if p.returncode:
            raise SystemExit(p.stderr[-3000:])
        doc = json.loads(p.stdout.strip().splitlines()[-1])
        doc["wall_s"] = time.perf_counter() - t0
        res[n] = doc
    model = load_tokenizer(tok)
    lat = {n: np.load(res[n]["latent"], allow_pickle=False) for n in res}
    with torch.no_grad():
        vid = {n: model.decode(torch.from_numpy(lat[n])[None]) for n in lat}
    print("## CP generation, dit-tiny, 13 x 128x128 (256 tokens), 32 Heun steps, CFG 3\n")
    print("| processes | denoising s | decode+write s | command wall s |")
    print("|---|---|---|---|")
    for n, d in res.items():
        print(f"| {n} | {d['sample_s']:.2f} | {d['decode_s']:.2f} | {d['wall_s']:.1f} |")
    print(
        f"\nmax abs diff 1 vs 2 ranks: latent {np.abs(lat[1] - lat[2]).max():.2e} "
        f"(latent max |z| {np.abs(lat[1]).max():.2f}), decoded video "
        f"{(vid[1] - vid[2]).abs().max().item():.2e} (range [-1, 1])"
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tok-minutes", type=float, default=2.0)
    ap.add_argument("--dit-steps", type=int, default=300)
    ap.add_argument("--out", default=None, help="work dir (default: a temp dir)")
    ap.add_argument("--experiment", default="bench-generate", help="MLflow experiment")
    args = ap.parse_args()
    out = Path(args.out or tempfile.mkdtemp(prefix="vfm-bench-gen-"))
    out.mkdir(parents=True, exist_ok=True)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, work dir {out}\n")
    tok = tokenizer_section(out, args.tok_minutes)
    run = dit_section(out, args.dit_steps, args.experiment)
    cp_section(out, run, tok)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    raise SystemExit(main())
