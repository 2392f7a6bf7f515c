"""The pyfunc face of a registered DiT: ``mlflow.pyfunc.load_model("models:/vfm-dit-tiny@champion")
.predict({"prompt": [...]})`` and ``mlflow models serve`` generate videos.

Artifacts (staged by :func:`vfm_core.registry.register.stage_artifacts`): ``checkpoint``, a run
directory holding ``config.yaml``, ``text.json`` (how captions were embedded) and the one
checkpoint registered; ``tokenizer``, the decoder the run generates with (absent for runs on
synthetic latents: a latent preview is written). :class:`VideoModel` is logged from code
(:mod:`vfm_core.infer.model_code`, by :mod:`vfm_core.registry.register`): the model folder holds
no pickle.

``predict`` input: a DataFrame (or dict of lists / list of records) with a ``prompt`` column and
optional ``frames``, ``size`` (``HxW``), ``seed``, ``steps``, ``guidance`` per row. Output: one
row per prompt with the MP4 as base64 (``mp4_base64``) and what was generated (``frames``,
``height``, ``width``, ``seed``, ``steps``, ``guidance``, ``checkpoint_step``).
"""

from __future__ import annotations

import base64
import math
import tempfile
from pathlib import Path
from typing import Any

import mlflow.pyfunc
import pandas as pd

from vfm_core.infer.shapes import GenerateError, parse_size

__all__ = ["VideoModel"]

DEFAULTS = {"frames": 5, "size": "32x32", "seed": 0, "steps": None, "guidance": None}
"""Per-row defaults of ``predict`` (a small, fast clip)."""
NUMBERS = {"frames": int, "seed": int, "steps": int, "guidance": float}
"""The numeric input columns and their types."""


def _rows(model_input: Any) -> list[dict[str, Any]]:
    """DataFrame / dict of lists / dict of scalars / list of records -> records, each with a
    text prompt and numbers of the right type (else an error naming the row and the column)."""
    if isinstance(model_input, dict):
        model_input = pd.DataFrame(
            model_input
            if any(isinstance(v, list | tuple) for v in model_input.values())
            else [model_input]
        )
    elif isinstance(model_input, list):
        model_input = pd.DataFrame(model_input)
    if not isinstance(model_input, pd.DataFrame) or "prompt" not in model_input.columns:
        raise GenerateError("predict: expected a table with a 'prompt' column")
    rows = []
    for i, rec in enumerate(model_input.to_dict("records")):
        row = {**DEFAULTS, **{k: v for k, v in rec.items() if not _missing(v)}}
        if not isinstance(row.get("prompt"), str):
            raise GenerateError(
                f"predict: row {i}, column 'prompt': expected the text of a prompt, got "
                f"{rec['prompt']!r}"
            )
        for col, kind in NUMBERS.items():
            if row[col] is not None:
                row[col] = _number(i, col, row[col], kind)
        rows.append(row)
    return rows


def _number(i: int, col: str, value: Any, kind: type) -> int | float:
    """``value`` of row ``i``'s column ``col`` as ``kind``; 2.5 is not an int."""
    try:
        x = kind(value)
        if x != float(value):
            raise ValueError(value)
    except (TypeError, ValueError):
        what = "an integer" if kind is int else "a number"
        raise GenerateError(
            f"predict: row {i}, column {col!r}: expected {what}, got {value!r}"
        ) from None
    return x


def _missing(v: Any) -> bool:
    return v is None or (isinstance(v, float) and math.isnan(v))


class VideoModel(mlflow.pyfunc.PythonModel):
    """Text -> MP4 with the registered DiT (loaded once in :meth:`load_context`)."""

    def load_context(self, context) -> None:
        from vfm_core.checkpoints.load import load_dit

        self.loaded = load_dit(context.artifacts["checkpoint"])
        self.tokenizer = context.artifacts.get("tokenizer")

    # a DataFrame hint: MLflow infers no schema from it (dicts and records pass through too)
    def predict(self, context, model_input: pd.DataFrame, params=None) -> pd.DataFrame:
        from vfm_core.infer.generate import GenerateRequest, generate

        out = []
        with tempfile.TemporaryDirectory(prefix="vfm-pyfunc-") as tmp:
            for i, row in enumerate(_rows(model_input)):
                height, width = parse_size(str(row["size"]))
                request = GenerateRequest(
                    prompt=row["prompt"],
                    frames=row["frames"],
                    height=height,
                    width=width,
                    seed=row["seed"],
                    steps=row["steps"],
                    guidance=row["guidance"],
                    gif=False,
                    progress=False,
                )
                mp4 = Path(tmp) / f"video_{i:03d}.mp4"
                res = generate(self.loaded, request, mp4, tokenizer=self.tokenizer)
                out.append(
                    {
                        "prompt": request.prompt,
                        "mp4_base64": base64.b64encode(mp4.read_bytes()).decode("ascii"),
                        "frames": res.frames,
                        "height": res.size[0],
                        "width": res.size[1],
                        "seed": res.seed,
                        "steps": res.steps,
                        "guidance": res.guidance,
                        "checkpoint_step": res.step,
                    }
                )
        return pd.DataFrame(out)
