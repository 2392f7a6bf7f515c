"""``make finetune``: the diffusion demo's model learns a concept it has never seen.

After ``make demo`` (its trained model, tokenizer and encoded shards under ``data/pipeline/demo``),
this flow writes a few captioned videos of a colour the demo's sample never shows
(``vfm sample --concept magenta``), curates, shards and encodes them with the demo's tokenizer,
then trains on them — a blend of 3/4 new clips and 1/4 the demo's own (replay, so what the model
knew is rehearsed) — in three ways for the same steps (600):

* **LoRA** from the demo's model (``train.init`` + ``train.lora.rank``: the adapters train),
* **full fine-tuning** from the demo's model (``train.init``: every weight trains),
* **from scratch** (the same data and steps, random weights: the peer fine-tuning must beat),

each also learning to continue a given first frame (``diffusion.frame_cond``: video-to-world),
and evaluates the demo's model and the three: prompt following of the new colour's 8 prompts
(3 clips each) and of the demo's 40 (forgetting), first-frame continuations of new clips (the
object's colour kept, its motion continued), the Fréchet distance on the new clips, wall time and
trainable parameters, in ``report.md`` / ``report.json`` and MLflow (experiment
``vfm-finetune``).
``VFM_FINETUNE_STEPS``, ``VFM_FINETUNE_VIDEOS``, ``VFM_FINETUNE_EVAL_SAMPLES`` and
``VFM_FINETUNE_EVAL_PROMPTS`` shrink it (the tests).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from prefect import flow

FINETUNE_OVERRIDES = {
    "LoRA rank 16": ["train.lora.rank=16", "optim.lr=0.003"],
    "full fine-tuning": ["optim.lr=0.0003"],
    "from scratch": ["optim.lr=0.001"],
}
"""What each mode trains with on top of the demo's settings (``train.init`` is added to the two
that start from the demo's model)."""
FRAME_COND = "diffusion.frame_cond=0.25"
"""Every mode also learns video-to-world (a quarter of its samples keep their first latent frame
clean): the demo's text-to-video model becomes one that continues a given first frame, as the
report's first-frame columns read back from pixels."""


@flow(name="finetune", log_prints=True)
def finetune_flow(
    *,
    demo: str = "",
    concept: str = "magenta",
    videos: int = 2,
    steps: int = 600,
    replay: float = 0.25,
    eval_samples: int = 32,
    eval_prompts: int = 40,
    eval_steps: int = 12,
    name: str = "finetune",
    work_dir: str = "",
    latent_grid: tuple[int, int, int] = (5, 8, 8),
    overrides: tuple[str, ...] = (),
) -> dict[str, Any]:
    """The fine-tuning demo (module docstring); ``demo``: the diffusion demo's work dir
    (default ``data/pipeline/demo``); ``replay``: the share of the demo's clips in the blend;
    ``latent_grid`` and ``overrides``: the demo's (a reduced demo's in the tests); ``work_dir``:
    its outputs (default ``data/pipeline/NAME``); ``eval_steps``: sampler steps of the
    evaluation's clips."""
    from flows.curate import CurateParams
    from flows.demo import DEMO_OVERRIDES
    from flows.pipeline import (
        PipelineParams,
        curate_stage,
        remove_earlier_run,
        shard_stage,
        train_settings,
    )
    from flows.shard import ShardParams
    from flows.train import TrainParams, train_flow
    from tasks.pipeline import caption_tokens, encode_stage, tokenizer_geometry
    from vfm_core.checkpoints.read import trained_params
    from vfm_core.finetune_report import finetune_report
    from vfm_core.output_lock import output_lock
    from vfm_core.tracking import data_dir
    from vfm_core.video.sample_set import SAMPLE_MAX_LEN_S, SAMPLE_MIN_LEN_S, write_sample_videos

    base = Path(demo or data_dir() / "pipeline" / "demo")
    model, tok, old = base / "train", base / "tokenizer", base / "latents"
    missing = [str(p) for p in (model, tok, old) if not p.exists()]
    if missing:
        raise ValueError(f"finetune: run `make demo` first ({', '.join(missing)} missing)")
    work = Path(work_dir or data_dir() / "pipeline" / name)
    raw = write_sample_videos(work / "raw", n=videos, concept=concept)[0].parent
    curate = CurateParams(
        src=str(raw),
        dst=str(work / "curated"),
        min_len_s=SAMPLE_MIN_LEN_S,
        max_len_s=SAMPLE_MAX_LEN_S,
    )
    curate_stage(curate)
    shard_stage(ShardParams(clips_dir=curate.dst, shards_dir=str(work / "shards")))
    latents = str(work / "latents")
    encode_stage(src=str(work / "shards"), dst=latents, tokenizer=str(tok))
    p = PipelineParams(name=name, latent_grid=latent_grid)
    settings = train_settings(
        p,
        latents=latents,
        tokenizer=str(tok),
        geometry=tokenizer_geometry(str(tok)),
        caption_tokens=caption_tokens(latents),
    )
    settings |= {"data.shards": "", "data.blend": f"{latents}:{1 - replay},{old}:{replay}"}
    rows = {
        "demo model (before)": _evaluate(
            str(model), tok, latents, concept, (eval_samples, eval_prompts, eval_steps), 0, 0.0
        )
    }
    for mode, extra in FINETUNE_OVERRIDES.items():
        init = [] if mode == "from scratch" else [f"train.init={model}"]
        params = TrainParams(
            recipe="dit-tiny",
            steps=steps,
            out_dir=str(work / mode.split()[0].lower()),
            experiment="vfm-finetune",
            settings=settings,
            overrides=[
                *DEMO_OVERRIDES,
                *overrides,
                *init,
                *extra,
                FRAME_COND,
                "train.ckpt_every=1000000",
            ],
        )
        with output_lock(Path(params.out_dir), what="out_dir"):
            remove_earlier_run(Path(params.out_dir))  # a rerun trains again, from its start
        t0 = time.perf_counter()
        run = train_flow(params)
        wall = time.perf_counter() - t0
        rows[mode] = _evaluate(
            params.out_dir,
            tok,
            latents,
            concept,
            (eval_samples, eval_prompts, eval_steps),
            trained_params(params.out_dir),
            wall,
        )
        rows[mode]["mlflow_run_id"] = run.get("mlflow_run_id")
    report = finetune_report(rows, concept=concept, steps=steps)
    (work / "report.md").write_text(report)
    (work / "report.json").write_text(json.dumps(rows, indent=1))
    print(report)
    return {"work_dir": str(work), "rows": rows, "report": report}


def _evaluate(
    checkpoint: str,
    tok: Path,
    latents: str,
    concept: str,
    sizes: tuple[int, int, int],
    trainable: int,
    wall: float,
) -> dict[str, Any]:
    """The evaluation of one model (``sizes``: FD clips, vocabulary prompts, sampler steps) on
    the new clips, with the new colour's prompts, its trainable parameters and wall time."""
    from tasks.generate import evaluate_checkpoint

    samples, prompts, steps = sizes
    m = evaluate_checkpoint(
        checkpoint,
        tokenizer=str(tok),
        samples=samples,
        prompts=prompts,
        steps=steps,
        concept=concept,
        heldout_shards=latents,
        untrained_baseline=False,
        frame_prompts=samples,
    )
    return {**m, "trainable": trainable, "wall_s": wall}


def main() -> int:
    from flows.demo import env_int
    from vfm_core.infra_env import use_running_services

    use_running_services()
    t0 = time.time()
    out = finetune_flow(
        steps=env_int("VFM_FINETUNE_STEPS", 600),
        videos=env_int("VFM_FINETUNE_VIDEOS", 2),
        eval_samples=env_int("VFM_FINETUNE_EVAL_SAMPLES", 32),
        eval_prompts=env_int("VFM_FINETUNE_EVAL_PROMPTS", 40),
    )
    print(f"finetune done in {time.time() - t0:.0f} s: {out['work_dir']}/report.md")
    return 0


if __name__ == "__main__":
    from flows.entry import run_main

    run_main(main, name="make finetune")
