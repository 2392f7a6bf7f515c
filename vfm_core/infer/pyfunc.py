"""The pyfunc face of a registered DiT: ``mlflow.pyfunc.load_model("models:/vfm-dit-tiny@champion")
.predict({"prompt": [...]})`` and ``mlflow models serve`` generate videos.

Artifacts (staged by :func:`vfm_core.registry.register.stage_artifacts`): ``checkpoint``, a run
directory holding ``config.yaml``, ``text.json`` (how captions were embedded) and the one
checkpoint registered; ``tokenizer``, the decoder the run generates with (absent for runs on
synthetic latents: a latent preview is written). :class:`VideoModel` is logged from code
(:mod:`vfm_core.infer.model_code`, by :mod:`vfm_core.registry.register`): the model folder holds
no pickle.

``predict`` input: a DataFrame (or dict of lists / dict of scalars / list of records) with the
columns of :data:`vfm_core.checkpoints.serving.INPUTS`: ``prompt`` and optional ``frames``,
``size`` (``HxW``), ``seed``, ``steps``, ``guidance`` per row. Every row is checked before any
video is made: its columns by :data:`RULES`, then its plan and cost from the run's config
(:func:`vfm_core.infer.request.preflight`: a size the model cannot take, a video over the
bounds). Input that breaks a rule raises ``MlflowException`` with ``INVALID_PARAMETER_VALUE`` and
one line naming the row, the column and the rule (``row 0, column 'steps': expected an integer in
[1, 1000], got -3``): the scoring server answers it with HTTP 400 and that line after its own
prefix (``Failed to predict data '...'.``), no stack trace. Loaded by MLflow, the model's
signature acts first: a missing ``prompt`` column is MLflow's own 400, a column it does not name
is dropped (a warning in the log). Output: one row per prompt with the MP4 as base64
(``mp4_base64``) and what was generated (``frames``, ``height``, ``width``, ``seed``, ``steps``,
``guidance``, ``checkpoint_step``).
"""

from __future__ import annotations

import base64
import math
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import mlflow.pyfunc
import numpy as np
import pandas as pd
from mlflow.exceptions import MlflowException

from vfm_core.checkpoints.serving import INPUTS
from vfm_core.infer.request import GUIDANCE_RANGE, STEPS_RANGE, GenerateRequest, preflight
from vfm_core.infer.shapes import GenerateError, parse_size

__all__ = ["RULES", "VideoModel", "input_rows"]

COLUMNS = {c.name: c for c in INPUTS}


def _text(v: Any) -> str:
    if not isinstance(v, str) or not v.strip():
        raise ValueError(v)
    return v


def _integer(lo: int, hi: int | None = None) -> Callable[[Any], int]:
    def check(v: Any) -> int:
        if isinstance(v, bool):
            raise TypeError(v)
        x = int(v)
        if x != float(v) or x < lo or (hi is not None and x > hi):  # 2.5 is not an integer
            raise ValueError(v)
        return x

    return check


def _number(lo: float, hi: float) -> Callable[[Any], float]:
    def check(v: Any) -> float:
        if isinstance(v, bool):
            raise TypeError(v)
        x = float(v)
        if not math.isfinite(x) or not lo <= x <= hi:
            raise ValueError(v)
        return x

    return check


def _size(v: Any) -> tuple[int, int]:
    if not isinstance(v, str):
        raise TypeError(v)
    return parse_size(v)  # a GenerateError is a ValueError


RULES: dict[str, tuple[str, Callable[[Any], Any]]] = {
    "prompt": ("the text of a prompt (not empty)", _text),
    "frames": ("an integer >= 1", _integer(1)),
    "size": ("HxW with two positive integers, e.g. 32x32", _size),
    "seed": ("an integer >= 0", _integer(0)),
    "steps": (f"an integer in [{STEPS_RANGE[0]}, {STEPS_RANGE[1]}]", _integer(*STEPS_RANGE)),
    "guidance": (
        f"a number in [{GUIDANCE_RANGE[0]:g}, {GUIDANCE_RANGE[1]:g}]",
        _number(*GUIDANCE_RANGE),
    ),
}
"""Column -> (the rule in words, the check: the value converted, else TypeError / ValueError)."""


def _bad(message: str) -> MlflowException:
    """Bad input: the scoring server answers it with HTTP 400 and this one line."""
    return MlflowException.invalid_parameter_value(message)


def _table(model_input: Any) -> pd.DataFrame:
    columns = (list, tuple, np.ndarray, pd.Series)
    try:
        if isinstance(model_input, dict):
            rows = any(isinstance(v, columns) for v in model_input.values())
            model_input = pd.DataFrame(model_input if rows else [model_input])
        elif isinstance(model_input, list):
            model_input = pd.DataFrame(model_input)
    except ValueError as e:  # columns of different lengths
        raise _bad(f"expected a table of rows: {e}") from None
    if not isinstance(model_input, pd.DataFrame):
        raise _bad(
            f"expected a table of rows with a 'prompt' column, got {type(model_input).__name__}"
        )
    return model_input


def input_rows(model_input: Any) -> list[dict[str, Any]]:
    """DataFrame / dict of lists / dict of scalars / list of records -> one dict per row with
    every column of :data:`RULES`: the row's value checked and converted (``size`` -> (H, W)),
    else the column's default. Raises ``MlflowException`` (``INVALID_PARAMETER_VALUE``) naming
    the first unknown or missing column, or the row, the column and the rule broken."""
    table = _table(model_input)
    unknown = [c for c in table.columns if c not in COLUMNS]
    if unknown:
        raise _bad(f"column {unknown[0]!r}: not an input (the inputs: {', '.join(COLUMNS)})")
    missing = [c.name for c in INPUTS if c.required and c.name not in table.columns]
    if missing:
        raise _bad(f"column {missing[0]!r}: required, missing")
    rows = []
    for i, rec in enumerate(table.to_dict("records")):
        row = {c.name: c.default for c in INPUTS}
        row.update({k: v for k, v in rec.items() if not _missing(v)})
        for col, value in row.items():
            if value is None and not COLUMNS[col].required:
                continue  # the run's own setting
            what, check = RULES[col]
            try:
                row[col] = check(value)
            except (TypeError, ValueError, OverflowError):  # int(inf): OverflowError
                raise _bad(f"row {i}, column {col!r}: expected {what}, got {value!r}") from None
        rows.append(row)
    return rows


def _missing(v: Any) -> bool:
    return v is None or v is pd.NA or (isinstance(v, float) and math.isnan(v))


class VideoModel(mlflow.pyfunc.PythonModel):
    """Text -> MP4 with the registered DiT (loaded once in :meth:`load_context`)."""

    def load_context(self, context) -> None:
        from vfm_core.checkpoints.load import load_dit

        self.loaded = load_dit(context.artifacts["checkpoint"])
        self.tokenizer = context.artifacts.get("tokenizer")

    # a DataFrame hint: MLflow infers no schema from it (dicts and records pass through too)
    def predict(self, context, model_input: pd.DataFrame, params=None) -> pd.DataFrame:
        from vfm_core.infer.generate import generate

        requests = [self._request(i, row) for i, row in enumerate(input_rows(model_input))]
        out = []
        with tempfile.TemporaryDirectory(prefix="vfm-pyfunc-") as tmp:
            for i, request in enumerate(requests):
                mp4 = Path(tmp) / f"video_{i:03d}.mp4"
                try:
                    res = generate(self.loaded, request, mp4, tokenizer=self.tokenizer)
                except GenerateError as e:
                    raise _bad(f"row {i}: {e}") from None
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

    def _request(self, i: int, row: dict[str, Any]) -> GenerateRequest:
        """Row ``i`` as a request, its plan and cost checked from the run's config."""
        height, width = row["size"]
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
        try:
            preflight(self.loaded.cfg, request, tokenizer=self.tokenizer)
        except GenerateError as e:
            raise _bad(f"row {i}: {e}") from None
        return request
