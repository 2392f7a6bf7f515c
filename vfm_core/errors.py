"""The one base of every error a user can cause.

A :class:`UserError` carries a message written for the user: the input (a video, a manifest, a
shard, a config key, a CLI flag, a checkpoint) and what is wrong with it. Every entry point
(``vfm``, the training entry point, the Prefect tasks through them) catches ``UserError`` once
and prints it as one line, ``error: ...``, exit 2 (``--debug`` adds the traceback); anything else
is a bug and keeps its traceback. The concrete errors keep a builtin second base
(``ValueError``, ``RuntimeError``, ``OSError``) so code that catches those still does.
"""

from __future__ import annotations


class UserError(Exception):
    """An error a user caused, with a message naming the input and the problem."""
