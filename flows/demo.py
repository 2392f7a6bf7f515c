"""``make demo``: the whole pipeline on the built-in synthetic sample, on CPU, then where to look.

sample videos → curate → shard → tokenizer → encode latents → train dit-tiny → generate → report,
as one Prefect flow (flows/pipeline.py) with every run in MLflow. A second ``make demo`` resumes:
finished stages come from Prefect's cache (their task runs are ``Cached``), a changed setting
reruns the stages that depend on it (``make clean`` starts over). ``VFM_DEMO_STEPS`` sets the
training steps; ``make demo FAMILY=autoregressive`` (``VFM_DEMO_FAMILY``) runs the autoregressive
family instead on the same sample, with the same evaluation and report: a discrete (FSQ) tokenizer
and ar-tiny, the causal transformer over its tokens.

When the servers of ``make up`` are running the demo uses them (its flow runs appear in that Prefect
UI, its MLflow runs in that MLflow server); otherwise an embedded Prefect API and the sqlite store
under ``data/``.
"""

from __future__ import annotations

import os
import sys
import time
from typing import TYPE_CHECKING

from vfm_core.infra_env import use_running_services
from vfm_core.recipes import FAMILIES

if TYPE_CHECKING:
    from flows.pipeline import PipelineParams

FOREACH_ADAMW = "optim.fused=false"
"""The demos' AdamW is the ``foreach`` pass their documented figures were trained with (the fused
kernel, the default, rounds differently: another trajectory, within the training-seed spread of
docs/families.md but not the documented run)."""

DEMO_OVERRIDES = [
    "optim.lr=0.001",
    "optim.schedule=cosine",
    "data.batch_size=8",
    # EDM noise levels for unit-variance latents, weighted towards high noise, where the layout
    # (object, colour, start and path) is decided: ln sigma ~ N(0, 1.5^2)
    "diffusion.p_mean=0.0",
    "diffusion.p_std=1.5",
    # weights averaged over the last ~100 steps (3 horizons = 300 steps, so the checkpoint's EMA
    # is what is sampled): FD 0.139 against 0.234 for the last raw weights (benchmarks/objective.py)
    "train.ema_decay=0.99",
    FOREACH_ADAMW,
]
"""What the diffusion demo trains with on top of the recipe (measured: benchmarks/objective.py)."""


AR_DEMO_OVERRIDES = [
    "optim.lr=0.001",
    "optim.schedule=cosine",
    "data.batch_size=8",
    "train.ema_decay=0.99",
    # classifier-free guidance by logit mixing (caption dropout 10% trains the null caption):
    # colour 82% at 3 against 28% without (measured one change at a time)
    "diffusion.guidance=3.0",
    FOREACH_ADAMW,
]
"""What the autoregressive demo trains and samples with on top of ar-tiny (measured: the table in
docs/families.md)."""
AR_DEMO_STEPS = 1300
"""The autoregressive demo's training steps: direction over 3 training seeds x 6 sampling seeds
50% at 1000 steps, 61% at 1300 (+85 s, the most the 10-minute demo allows; docs/families.md)."""
AR_DEMO_TOP_K = 16
"""The autoregressive demo draws each token from the 16 likeliest of 256 (videos and evaluation):
at 1300 steps over the same seeds colour 85 -> 89%, direction 61 -> 64% (the same table)."""


def env_int(name: str, default: int) -> int:
    value = os.environ.get(name, "")
    try:
        return int(value) if value else default
    except ValueError:
        raise SystemExit(f"{name}={value!r}: expected an integer") from None


def demo_params(family: str) -> PipelineParams:
    """The demo's pipeline parameters for ``family`` (call after `use_running_services`); the
    same captioned sample, evaluation and report for both families. ``VFM_DEMO_VIDEOS``,
    ``VFM_DEMO_STEPS``, ``VFM_DEMO_TOKENIZER_STEPS``, ``VFM_DEMO_EVAL_SAMPLES`` and
    ``VFM_DEMO_EVAL_PROMPTS`` shrink it (the CI runs both demos that way)."""
    from flows.pipeline import PipelineParams
    from vfm_core.video.sample_set import SAMPLE_MAX_LEN_S, SAMPLE_MIN_LEN_S

    diffusion = family == "diffusion"
    return PipelineParams(
        name="demo" if diffusion else "demo-ar",
        family=family,
        # 384 captioned clips: every training combination on both backgrounds, many times; the
        # Fréchet distance on all 384 (two halves of the data: 0.53 apart at 48 clips, 0.18 at
        # 192: the estimate's floor falls as 1/N, measured)
        sample_videos=env_int("VFM_DEMO_VIDEOS", 48),
        # the sample's short shots, not the curation defaults (2-20 s)
        min_len_s=SAMPLE_MIN_LEN_S,
        max_len_s=SAMPLE_MAX_LEN_S,
        eval_samples=env_int("VFM_DEMO_EVAL_SAMPLES", 384),
        eval_prompts=env_int("VFM_DEMO_EVAL_PROMPTS", 40),
        train_steps=env_int("VFM_DEMO_STEPS", 1000 if diffusion else AR_DEMO_STEPS),
        tokenizer_steps=env_int("VFM_DEMO_TOKENIZER_STEPS", 1500),
        overrides=DEMO_OVERRIDES if diffusion else AR_DEMO_OVERRIDES,
        # diffusion: 17 frames (5 x 8 x 8 latents); autoregressive: 9 frames, 3 x 8 x 8 = 192
        # tokens, each drawn by one model call
        latent_grid=(5, 8, 8) if diffusion else (3, 8, 8),
        top_k=0 if diffusion else AR_DEMO_TOP_K,
        experiment="vfm-demo",
    )


def main() -> int:
    used = use_running_services()  # before prefect is imported: it reads its settings then
    from flows.pipeline import pipeline_flow
    from vfm_core.tracking import free_local_port, tool_command, ui_hint

    t0 = time.time()
    family = os.environ.get("VFM_DEMO_FAMILY", "diffusion")
    if family not in FAMILIES:
        print(f"VFM_DEMO_FAMILY={family!r}: expected one of {', '.join(FAMILIES)}", file=sys.stderr)
        return 2
    params = demo_params(family)
    out = pipeline_flow(params)
    tr = out["train"]
    print("\n" + "=" * 78)
    print(f"demo done in {time.time() - t0:.0f} s: {out['work_dir']}")
    print(out["report"])
    print()
    if out.get("generate"):
        for video in out["generate"]["videos"]:
            print(f"  generated:   {video['mp4']}  (+ .gif)")
        if out["generate"].get("contact_sheet"):
            print(f"  frames:      {out['generate']['contact_sheet']}")
    print(f"  checkpoint:  {tr['checkpoint']}")
    print(f"  report:      {out['work_dir']}/report.md")
    print(
        f"  MLflow:      experiment vfm-demo, run 'pipeline {params.name}' "
        f"({out['mlflow_run_id']}) with its train / evaluate / generate runs"
    )
    print(f"  MLflow UI:   {ui_hint()}")
    if "PREFECT_API_URL" in used:
        print(f"  Prefect UI:  open {used['PREFECT_API_URL'].removesuffix('/api')}/runs")
    else:
        home = os.environ.get("PREFECT_HOME", "~/.prefect")
        port = free_local_port(4200)  # not one make up's server (or anything else) holds
        print(
            f"  Prefect UI:  PREFECT_HOME={home} {tool_command('prefect')} server start "
            f"--port {port}, then open http://127.0.0.1:{port}/runs"
        )
    print("=" * 78)
    return 0


if __name__ == "__main__":
    from flows.entry import run_main

    run_main(main, name="make demo")
