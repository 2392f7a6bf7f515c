"""The end-to-end pipeline's report: one markdown table row per stage (curate, shard, tokenizer,
train, generate, prompt following) from the stages' summary dicts, the line that says where the
MLflow runs are, and the headline metrics repeated on the pipeline's own MLflow run. Pure: the
Prefect task (:func:`tasks.report.pipeline_report_task`) writes ``report.md`` and the artifact.

``stages`` is the pipeline flow's output: ``work_dir``, ``reused`` (the stages answered from the
cache of an earlier run) and one summary per stage that ran (``curate``, ``shard``, ``tokenizer``
when trained, ``train``, ``generate`` when prompts were given).
"""

from __future__ import annotations

import math
from typing import Any

from vfm_core.tracking import tracking_uri, ui_hint

HEADLINE = (
    "prompt_colour_acc",
    "prompt_direction_acc",
    "prompt_colour_acc_held_out",
    "prompt_direction_acc_held_out",
    "untrained_prompt_colour_acc",
    "untrained_prompt_direction_acc",
    "fd_ratio_untrained",
    "loss_reduction",
    "frechet_distance",
    "untrained_frechet_distance",
    "fd_data_halves",
    "heldout_loss",
    "heldout_bits_per_token",
)
"""Evaluation metrics repeated on the pipeline's own MLflow run (compare pipelines at a glance)."""
TOKENIZER_HEADLINE = ("psnr", "baseline_psnr", "ssim", "baseline_ssim", "codebook_usage")
"""Tokenizer figures repeated there as ``tokenizer_<key>`` (codebook usage: discrete only)."""


def headline_metrics(stages: dict[str, Any]) -> dict[str, float]:
    """The pipeline run's metrics, the same keys for both families where both have them:
    :data:`HEADLINE` of the evaluation and the tokenizer's PSNR / SSIM next to their mean-colour
    baselines (and its codebook usage when it is discrete)."""
    m = stages.get("generate", {}).get("metrics") or {}
    got = {k: float(m[k]) for k in HEADLINE if k in m}
    tok = stages.get("tokenizer", {})
    for k in TOKENIZER_HEADLINE:
        v = tok.get(k)
        if isinstance(v, (int, float)) and math.isfinite(v):
            got[f"tokenizer_{k}"] = float(v)
    return got


def pipeline_report(
    stages: dict[str, Any], *, name: str, recipe: str, experiment: str, parent_run_id: str
) -> str:
    """The report of pipeline ``name`` (module docstring) as markdown."""
    lines = [
        f"# vfm pipeline `{name}`",
        "",
        "| stage | result |",
        "|---|---|",
        _curate_row(stages["curate"]),
        _shard_row(stages["shard"]),
    ]
    if "tokenizer" in stages:
        lines.append(_tokenizer_row(stages["tokenizer"]))
    lines.append(_train_row(recipe, stages["train"]))
    if "generate" in stages:
        lines += _generate_rows(stages["generate"])
    if stages.get("stage_times"):
        lines += ["", _times_line(stages["stage_times"])]
    lines += ["", _runs_line(stages, experiment, parent_run_id)]
    return "\n".join(lines)


def _times_line(times: dict[str, dict[str, Any]]) -> str:
    """Wall seconds per stage of this run (a stage from the cache: 'reused'), with the load
    average as the first ran stage started: on a busy machine every stage takes longer."""
    parts = [
        f"{name} reused" if t["cached"] else f"{name} {t['seconds']:.0f} s"
        for name, t in times.items()
    ]
    ran = [t for t in times.values() if not t["cached"]]
    total = sum(t["seconds"] for t in ran)
    load = next((t["load_at_start"] for t in ran if "load_at_start" in t), None)
    at = f", load average {load:.1f} at the start" if load is not None else ""
    return f"Stage times: {', '.join(parts)} ({total:.0f} s in all{at})."


def _curate_row(c: dict[str, Any]) -> str:
    return f"| curate | {c['n_clips']} clips, {c['n_rejects']} rejects: `{c['clips']}` |"


def _shard_row(s: dict[str, Any]) -> str:
    return f"| shard | {s['n_samples']} samples in {s['n_shards']} shards: `{s['index']}` |"


def _tokenizer_row(tk: dict[str, Any]) -> str:
    ssim = f", SSIM {tk['ssim']:.3f} (baseline {tk['baseline_ssim']:.3f})" if "ssim" in tk else ""
    usage = tk.get("codebook_usage")
    if usage is not None and not math.isnan(usage):  # a discrete tokenizer
        ssim += f", {usage:.1%} of the codebook used"
    return (
        f"| tokenizer | {tk['preset']}, PSNR {tk['psnr']:.1f} dB "
        f"(mean-colour baseline {tk['baseline_psnr']:.1f}){ssim}: `{tk['dir']}` |"
    )


def _train_row(recipe: str, tr: dict[str, Any]) -> str:
    final = tr.get("final", {})
    return (
        f"| train | {recipe} {tr['step']} steps, loss {final.get('loss', float('nan')):.4f}, "
        f"MFU {final.get('mfu', 0):.1%}, MLflow run `{tr.get('mlflow_run_id')}` |"
    )


def _generate_rows(g: dict[str, Any]) -> list[str]:
    """The generated videos with the evaluation, the vocabulary prompts' and the user's prompts'
    following, and the contact sheet."""
    m = g.get("metrics") or {}
    videos = ", ".join(f"`{v['mp4']}`" for v in g["videos"])
    rows = [f"| generate | {len(g['videos'])} videos{_evaluation(m)}: {videos} |"]
    if "prompt_colour_acc" in m:
        rows.append(_following_row(m, g.get("prompt_sheet")))
    if g.get("prompt_following"):
        pf = g["prompt_following"]
        held = (
            f"; held-out combinations: colour {pf['colour_acc_held_out']:.0%}, direction "
            f"{pf['direction_acc_held_out']:.0%}"
            if "colour_acc_held_out" in pf
            else ""
        )
        rows.append(
            f"| your prompts | {int(pf['n_scored'])} generated videos read back from "
            f"the pixels: colour {pf['colour_acc']:.0%}, direction "
            f"{pf['direction_acc']:.0%}{held} |"
        )
    if g.get("contact_sheet"):
        rows.append(f"| contact sheet | one row per prompt: `{g['contact_sheet']}` |")
    return rows


def _evaluation(m: dict[str, float]) -> str:
    """The evaluation's part of the generate row, one form for both families: the held-out loss
    (EDM loss, or bits per token for the autoregressive family against a uniform guess) and the
    Fréchet distance against the untrained model and the data's own floor."""
    if not m:
        return ""
    if "heldout_bits_per_token" in m:  # autoregressive
        text = (
            f"; held-out {m['heldout_bits_per_token']:.2f} bits/token (uniform "
            f"{m['uniform_bits_per_token']:.2f})"
        )
        lower = "bits/token"
    else:
        text = f"; held-out loss {m['heldout_loss']:.4f}"
        lower = "held-out loss"
    if "frechet_distance" not in m:  # an evaluation written before both families had it
        return text
    text += f", Fréchet distance {m['frechet_distance']:.3f}"
    if "fd_ratio_untrained" in m:
        text += (
            f" ({m['fd_ratio_untrained']:.1f}x lower than untrained "
            f"{m['untrained_frechet_distance']:.3f}"
        )
        if "fd_data_halves" in m:  # the floor of this sample size
            text += (
                f"; two halves of the data: {m['fd_data_halves']:.3f} at "
                f"{int(m['fd_samples']) // 2} clips each"
            )
        text += f"; {lower} {m['loss_reduction']:.0%} lower)"
    return text


def _following_row(m: dict[str, float], sheet: str | None) -> str:
    """Report row of the evaluation's vocabulary prompts: accuracies, trained vs untrained."""

    def pair(key: str) -> str:
        base = m.get(f"untrained_{key}")
        return f"{m[key]:.0%}" + (f" (untrained {base:.0%})" if base is not None else "")

    text = (
        f"| prompt following | {int(m.get('prompt_n_scored', 0))} vocabulary prompts, "
        f"colour and direction read back from the pixels: colour {pair('prompt_colour_acc')},"
        f" direction {pair('prompt_direction_acc')}"
    )
    if "prompt_colour_acc_held_out" in m:
        text += (
            f"; held-out combinations: colour {m['prompt_colour_acc_held_out']:.0%}, "
            f"direction {m['prompt_direction_acc_held_out']:.0%}"
        )
    return text + (f"; one row per prompt: `{sheet}` |" if sheet else " |")


def _runs_line(stages: dict[str, Any], experiment: str, parent: str) -> str:
    """Where the runs are: the stages' MLflow runs are nested under this pipeline run when this
    run made them; a stage reused from an earlier run keeps its run where that run logged it."""
    reused = stages["reused"]
    made = [s for s in ("train", "generate") if s in stages and s not in reused]
    head = f"Runs: {ui_hint()} (experiment `{experiment}`, pipeline run `{parent}`"
    nested = {"train": "train", "generate": "evaluate / generate"}
    if made:
        head += " with the " + " and ".join(nested[s] for s in made) + " runs nested under it"
    earlier = []
    for s in ("train", "generate"):
        summary = stages.get(s, {})
        if s in reused and summary.get("mlflow_run_id"):
            uri = summary.get("tracking_uri")
            where = "" if uri in (None, tracking_uri()) else f" in the store {uri}"
            earlier.append(f"{s} run `{summary['mlflow_run_id']}`{where}")
    if earlier:
        head += (
            "; reused from an earlier run of this pipeline, not nested here: "
            + ", ".join(earlier)
            + "; `make clean` starts over"
        )
    return head + ")"
