"""Generation time estimates against the time taken, both families, on demo-sized models.

    .venv/bin/python benchmarks/generation_estimate.py [--repeats 1] [--out DIR]

Each row builds its run from the recipes (random weights, saved in the `vfm train` layout, and a
random tokenizer of the family's preset: nothing downloaded), then generates the request in this
process with :func:`vfm_core.infer.generate.generate` and prints, in seconds: the FLOPs estimate
the bounds check before any weights load (:func:`vfm_core.infer.request.preflight`), the
estimate once a probe measured this device (:mod:`vfm_core.infer.probe`; what ``vfm generate``
prints), the time taken (sampling, decoding and writing: the result's ``sample_s + decode_s``),
their ratio, and what the probe cost. Untrained models draw noise, the costliest frames to write
as GIF. ``--repeats`` generates each request again (another seed) and prints every run.
"""

from __future__ import annotations

import argparse
import tempfile
import warnings
from pathlib import Path

import numpy as np
import torch

from vfm_core.checkpoints.manager import CheckpointManager
from vfm_core.config import apply_overrides, save_yaml, to_dict, validate
from vfm_core.families import build_model
from vfm_core.infer.generate import GenerateRequest, generate
from vfm_core.infer.request import preflight
from vfm_core.recipes import get_recipe
from vfm_core.tokenizer import CausalVideoAutoencoder, get_tokenizer_config, save_tokenizer

RUNS = {  # name: (recipe, tokenizer preset, overrides)
    "dit-tiny": ("dit-tiny", "tok-tiny", ["diffusion.num_steps=24"]),
    "ar-tiny": ("ar-tiny", "tok-tiny-discrete", ["diffusion.guidance=3.0"]),
}
ROWS = [  # run, request fields
    ("dit-tiny", dict(frames=17, height=64, width=64)),  # the demo's videos: 24 Heun steps
    ("dit-tiny", dict(frames=13, height=128, width=128, steps=12)),
    ("dit-tiny", dict(frames=33, height=64, width=64, steps=8, gif=False)),
    ("ar-tiny", dict(frames=9, height=64, width=64, top_k=16)),  # the demo's: 192 tokens
    ("ar-tiny", dict(frames=17, height=64, width=64, top_k=16)),  # 320 tokens
]


def make_run(root: Path, name: str) -> tuple[Path, Path]:
    """(run dir, tokenizer dir) of ``name`` with random weights."""
    recipe, tok_preset, overrides = RUNS[name]
    cfg = validate(apply_overrides(get_recipe(recipe), ["train.device=cpu", *overrides]))
    torch.manual_seed(0)
    sd = build_model(cfg.model).state_dict()
    state = {"model": sd, "ema": {k: v.clone() for k, v in sd.items()}}
    CheckpointManager(root / name).save(1, state, meta={"model": to_dict(cfg.model)})
    save_yaml(cfg, root / name / "config.yaml")
    tok = root / f"{name}-tokenizer"
    save_tokenizer(CausalVideoAutoencoder(get_tokenizer_config(tok_preset)), tok)
    return root / name, tok


def shape(req: GenerateRequest, steps: int) -> str:
    what = f"{req.frames}x{req.height}x{req.width}"
    return what + (f", {steps} steps" if steps else "") + ("" if req.gif else ", no GIF")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=1, help="generations of each request")
    ap.add_argument("--out", help="folder of the runs and videos (default: a temporary one)")
    args = ap.parse_args()
    warnings.simplefilter("ignore")  # sizes beyond the runs' training shape
    emb = np.ones((1, 384), dtype=np.float32) / np.sqrt(384)
    with tempfile.TemporaryDirectory(prefix="vfm-estimate-") as tmp:
        root = Path(args.out or tmp)
        runs = {name: make_run(root, name) for name in RUNS}
        print(f"## generation time: estimate vs measured ({torch.get_num_threads()} threads)\n")
        print("| run | request | FLOPs estimate s | estimated s | measured s | ratio | probe s |")
        print("|---|---|---:|---:|---:|---:|---:|")
        ratios = []
        for name, fields in ROWS:
            run, tok = runs[name]
            cfg = validate(apply_overrides(get_recipe(RUNS[name][0]), RUNS[name][2]))
            for seed in range(args.repeats):
                req = GenerateRequest(prompt="a red disc moving right", seed=seed, **fields)
                flops_s = preflight(cfg, req, tokenizer=tok).seconds
                res = generate(run, req, root / f"{name}-{seed}.mp4", tokenizer=tok, text_emb=emb)
                took = res.sample_s + res.decode_s
                ratios.append(took / res.estimate_s)
                steps = res.steps if name.startswith("dit") else 0
                print(
                    f"| {name} | {shape(req, steps)} | {flops_s:.2f} | {res.estimate_s:.2f} | "
                    f"{took:.2f} | {ratios[-1]:.2f} | {res.probe_s:.2f} |",
                    flush=True,
                )
        print(f"\nmeasured / estimated: {min(ratios):.2f} - {max(ratios):.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
