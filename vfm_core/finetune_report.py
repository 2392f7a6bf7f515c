"""The fine-tuning demo's report (``make finetune``, :mod:`flows.finetune`): one markdown row per
model (the demo's model before, LoRA, full fine-tuning, from scratch) with its trainable
parameters, wall time, prompt following of the new colour and of the old vocabulary (forgetting:
the share of the old colour accuracy kept), first-frame continuations of new clips (colour kept,
motion continued) and the Fréchet distance on the new clips. Pure."""

from __future__ import annotations

from typing import Any

TARGETS = {"concept": 0.7, "kept": 0.9}
"""The fine-tuned model follows the new colour in >= 70% of its prompts and keeps >= 90% of the
model's colour accuracy on the old prompts."""


def finetune_report(rows: dict[str, dict[str, Any]], *, concept: str, steps: int) -> str:
    """The markdown table of ``rows`` (model -> its evaluation, ``trainable``, ``wall_s``; the
    first row the model before fine-tuning) and the targets."""
    before = rows["demo model (before)"]
    old = before.get("prompt_colour_acc", 0.0)
    lines = [
        f"# Fine-tuning the demo's model on a new colour: {concept}",
        "",
        f"{steps} steps per run on the new clips blended with the demo's (replay); prompt "
        f"following of the {concept} prompts (new) and of the demo's vocabulary (old), read "
        "back from pixels; first frame: new clips continued from their first frame "
        "(image-to-video), the object's colour and direction read back from both; Fréchet "
        "distance on the new clips.",
        "",
        "| model | trainable params | wall s | new colour | new direction | old colour "
        "| old direction | kept (old colour / before) | first frame: colour kept "
        "| first frame: motion continued | FD |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for mode, r in rows.items():
        kept = r.get("prompt_colour_acc", 0.0) / old if old else 0.0
        trained = f"{r['trainable']:,} | {r['wall_s']:.0f}" if r["trainable"] else "— | —"
        lines.append(
            f"| {mode} | {trained} | "
            f"{r.get('concept_colour_acc', 0.0):.0%} | {r.get('concept_direction_acc', 0.0):.0%} | "
            f"{r.get('prompt_colour_acc', 0.0):.0%} | {r.get('prompt_direction_acc', 0.0):.0%} | "
            f"{kept:.0%} | {r.get('frame_colour_kept', 0.0):.0%} | "
            f"{r.get('frame_motion_kept', 0.0):.0%} | {r['frechet_distance']:.3f} |"
        )
    lines += [
        "",
        f"Targets: new colour >= {TARGETS['concept']:.0%}, kept >= {TARGETS['kept']:.0%}.",
    ]
    return "\n".join(lines) + "\n"
