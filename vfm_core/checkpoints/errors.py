"""The one error of checkpoints, reported to the user in one line (exit code 2)."""

from __future__ import annotations

from vfm_core.errors import UserError


class CheckpointError(UserError, RuntimeError):
    """A checkpoint is missing, unreadable or does not fit the model being trained."""
