"""EDM vs rectified flow on the demo's data: which objective should the demo train?

    .venv/bin/python benchmarks/objective.py --pipeline data/pipeline/demo [--steps 1000]

Takes the latent shards and tokenizer a `make demo` run left (``--pipeline``), trains dit-tiny
with each ``diffusion.objective`` for the same steps, seed, batch and learning-rate schedule as
the demo (``flows.demo.DEMO_OVERRIDES``; the EDM noise-level settings apply to EDM only) and
evaluates both checkpoints as the demo does (:func:`vfm_core.infer.evaluate.evaluate`): held-out
loss ratio to the untrained model (each objective's own loss), Fréchet distance of generated
clips and its ratio to the untrained model, and prompt following (colour / direction read back
from the pixels) over the 40 vocabulary prompts, held-out combinations separately. Also the
demo's setting without the absolute position features (``model.abs_pos=0``: 3D RoPE only), the
ablation behind the tiny recipes' ``abs_pos``, and without the demo's weight average
(``train.ema_decay=0``: the last raw weights are sampled). Wall time of training is reported too.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from flows.demo import DEMO_OVERRIDES
from vfm_core.config import apply_overrides
from vfm_core.infer.evaluate import EvalConfig, evaluate
from vfm_core.recipes import get_recipe
from vfm_core.train.main import run_training

VARIANTS = {
    "edm (demo)": ["diffusion.objective=edm"],
    "rectified_flow": ["diffusion.objective=rectified_flow"],
    "edm, RoPE only (abs_pos=0)": ["diffusion.objective=edm", "model.abs_pos=0"],
    "edm, last weights (no EMA)": ["diffusion.objective=edm", "train.ema_decay=0"],
}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pipeline", required=True, help="work dir of a `make demo` run")
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument(
        "--samples", type=int, default=384, help="clips for the Fréchet distance (the demo's 384)"
    )
    ap.add_argument("--only", choices=list(VARIANTS), action="append", help="variants to run")
    args = ap.parse_args()
    work = Path(args.pipeline)
    tok = str(work / "tokenizer")
    if not (work / "latents" / "index.json").exists():
        ap.error(f"--pipeline {work}: no latents/index.json (run `make demo` first)")
    rows = []
    for name in args.only or list(VARIANTS):
        rf = "rectified_flow" in name
        demo = [o for o in DEMO_OVERRIDES if not (rf and o.startswith("diffusion.p_"))]
        out = Path(tempfile.mkdtemp(prefix="vfm-objective-"))
        cfg = apply_overrides(
            get_recipe("dit-tiny"),
            [
                "data.source=shards",
                f"data.shards={work / 'latents'}",
                f"data.tokenizer={tok}",
                "data.latent_frames=5",
                "data.latent_height=8",
                "data.latent_width=8",
                "diffusion.sigma_data=1.0",
                *demo,
                f"train.steps={args.steps}",
                "train.ckpt_every=100000",
                "tracking.mlflow=false",
                *VARIANTS[name],
            ],
        )
        t0 = time.perf_counter()
        run_training(cfg, out_dir=out / "run", progress=False)
        train_s = time.perf_counter() - t0
        m = evaluate(
            out / "run",
            tokenizer=tok,
            config=EvalConfig(
                loss_samples=args.samples,
                fd_samples=args.samples,
                contact_sheet=str(out / "prompt_following.png"),
            ),
        )
        print(f"{name}: contact sheet {out / 'prompt_following.png'}", flush=True)
        rows.append({"variant": name, "train_s": train_s, **m})
    print(
        f"\ndit-tiny, {args.steps} steps on {work / 'latents'}, 40 vocabulary prompts, "
        f"{args.samples} clips for the FD\n"
    )
    print(
        "| variant | train s | held-out loss vs untrained | FD | FD ratio untrained/trained | "
        "colour acc | direction acc | colour (held-out) | direction (held-out) |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        acc = [
            r.get(f"prompt_{k}", float("nan"))
            for k in (
                "colour_acc",
                "direction_acc",
                "colour_acc_held_out",
                "direction_acc_held_out",
            )
        ]
        print(
            f"| {r['variant']} | {r['train_s']:.0f} | {1 - r['loss_reduction']:.2f}x | "
            f"{r['frechet_distance']:.3f} | {r['fd_ratio_untrained']:.2f} | "
            + " | ".join(f"{a:.0%}" for a in acc)
            + " |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
