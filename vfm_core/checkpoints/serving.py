"""What a registered version's pyfunc takes and answers, declared once for both of its sides:
:class:`vfm_core.infer.pyfunc.VideoModel` checks its input against :data:`INPUTS`, and
:mod:`vfm_core.registry.register` logs :func:`signature` and :data:`INPUT_EXAMPLE` with the model
(``train``, ``infer`` and ``registry`` never import one another: what they share lives here).

Input: one row per video. ``prompt`` (text) is required; ``frames``, ``size`` (``HxW``),
``seed``, ``steps`` and ``guidance`` are optional, each with a default (``None``: the run's own).
The numeric columns are declared ``Any`` in the signature, not ``long`` / ``double``: MLflow's
scoring server casts a ``long`` column with ``astype`` (2.5 arrives as 2, a row that leaves the
column out is refused with a pandas error) and refuses an integer in a ``double`` column, so the
values reach ``VideoModel.predict`` as sent and it checks them, in one line per broken rule.
Output: one row per video (:data:`OUTPUTS`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["INPUTS", "INPUT_EXAMPLE", "OUTPUTS", "InputColumn", "signature"]


@dataclass(kw_only=True, slots=True, frozen=True)
class InputColumn:
    """One input column of the pyfunc."""

    name: str
    required: bool = False
    """A row without it is refused."""
    default: Any = None
    """The value of a row that leaves it out (None: the run's own setting)."""
    text: bool = False
    """Declared ``string`` in the signature (else ``Any``: checked by the model, see above)."""


INPUTS = (
    InputColumn(name="prompt", required=True, text=True),
    InputColumn(name="frames", default=5),
    InputColumn(name="size", default="32x32", text=True),
    InputColumn(name="seed", default=0),
    InputColumn(name="steps"),
    InputColumn(name="guidance"),
)
"""The input columns, in the signature's order (defaults: a small, fast clip)."""
OUTPUTS = (
    ("prompt", "string"),
    ("mp4_base64", "string"),
    ("frames", "long"),
    ("height", "long"),
    ("width", "long"),
    ("seed", "long"),
    ("steps", "long"),
    ("guidance", "double"),
    ("checkpoint_step", "long"),
)
"""The output columns and their MLflow types: the MP4 as base64 and what was generated."""
INPUT_EXAMPLE = {"prompt": "a red circle moving right", "frames": 5, "size": "32x32", "seed": 0}
"""The input example logged with a version (one row, the defaults written out)."""


def signature():
    """The :class:`mlflow.models.ModelSignature` of :data:`INPUTS` and :data:`OUTPUTS` (no
    params: everything is per row)."""
    from mlflow.models import ModelSignature
    from mlflow.types.schema import AnyType, ColSpec, Schema

    inputs = [
        ColSpec("string" if c.text else AnyType(), c.name, required=c.required) for c in INPUTS
    ]
    return ModelSignature(
        inputs=Schema(inputs), outputs=Schema([ColSpec(t, name) for name, t in OUTPUTS])
    )
