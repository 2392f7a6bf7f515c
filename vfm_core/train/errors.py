"""Errors a training run reports to the user in one line (the entry point turns them into exit
code 2)."""

from __future__ import annotations

from vfm_core.errors import UserError


class TrainingDiverged(UserError, RuntimeError):
    """Loss or gradient norm became NaN/inf; raised before the optimizer touches the weights."""
