"""EDM vs rectified flow on the demo's data: which objective should the demo train?

    .venv/bin/python benchmarks/objective.py --pipeline data/pipeline/demo [--steps 1000]

Takes the latent shards and tokenizer a `make demo` run left (``--pipeline``), trains dit-tiny
with each ``diffusion.objective`` for the same steps, seed and learning rate as the demo, and
evaluates both checkpoints the same way: held-out loss ratio to the untrained model (each
objective's own loss), Fréchet distance of generated clips and its ratio to the untrained model,
and prompt following (colour / direction read back from the pixels) over every vocabulary
combination's caption, held-out combinations separately. Wall time of training is reported too.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from vfm_core.config import apply_overrides
from vfm_core.infer.evaluate import EvalConfig, evaluate
from vfm_core.recipes import get_recipe
from vfm_core.train.main import run_training


def prompt_following(run: Path, tokenizer: str, out: Path, prompts: list[str]) -> dict:
    from vfm_core.infer.generate import GenerateRequest, generate
    from vfm_core.infer.prompt_follow import score_videos

    videos = []
    for i, prompt in enumerate(prompts):
        req = GenerateRequest(prompt=prompt, frames=9, height=64, width=64, seed=i, steps=24)
        videos.append(generate(run, req, out / f"v{i:02d}.mp4", tokenizer=tokenizer).mp4)
    return score_videos(videos, prompts) or {}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pipeline", required=True, help="work dir of a `make demo` run")
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--prompts", type=int, default=16, help="vocabulary prompts to generate")
    args = ap.parse_args()
    work = Path(args.pipeline)
    tok = str(work / "tokenizer")
    if not (work / "latents" / "index.json").exists():
        ap.error(f"--pipeline {work}: no latents/index.json (run `make demo` first)")
    from vfm_core.video.captioned import all_subjects

    combos = all_subjects()  # (colour, shape, direction)
    step = max(1, len(combos) // args.prompts)
    prompts = [f"a {c} {s} moving {d}" for c, s, d in combos[::step]][: args.prompts]
    rows = []
    for objective in ("edm", "rectified_flow"):
        out = Path(tempfile.mkdtemp(prefix=f"vfm-objective-{objective}-"))
        cfg = apply_overrides(get_recipe("dit-tiny"), [
            "data.source=shards", f"data.shards={work / 'latents'}", f"data.tokenizer={tok}",
            "data.latent_frames=3", "data.latent_height=8", "data.latent_width=8",
            "optim.lr=0.001", f"train.steps={args.steps}", "train.ckpt_every=100000",
            "tracking.mlflow=false", f"diffusion.objective={objective}",
        ])  # fmt: skip
        t0 = time.perf_counter()
        run_training(cfg, out_dir=out / "run", progress=False)
        train_s = time.perf_counter() - t0
        m = evaluate(out / "run", tokenizer=tok, config=EvalConfig(loss_samples=16,
                                                                   fd_samples=16))  # fmt: skip
        pf = prompt_following(out / "run", tok, out / "gen", prompts)
        rows.append({"objective": objective, "train_s": train_s, **m, **pf})
    print(f"\ndit-tiny, {args.steps} steps on {work / 'latents'}, {len(prompts)} prompts\n")
    print("| objective | train s | held-out loss vs untrained | FD | FD ratio untrained/trained | "
          "colour acc | direction acc | colour (held-out) | direction (held-out) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        acc = [r.get(k, float("nan")) for k in ("colour_acc", "direction_acc",
                                                "colour_acc_held_out", "direction_acc_held_out")]
        print(f"| {r['objective']} | {r['train_s']:.0f} | {1 - r['loss_reduction']:.2f}x | "
              f"{r['frechet_distance']:.3f} | {r['fd_ratio_untrained']:.2f} | "
              + " | ".join(f"{a:.0%}" for a in acc) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
