"""Logging for tasks that also works when a task body is called directly (``task.fn()``)."""

from __future__ import annotations

import logging
import re

from prefect import get_run_logger
from prefect.exceptions import MissingContextError


def task_logger() -> logging.Logger | logging.LoggerAdapter:
    try:
        return get_run_logger()
    except MissingContextError:
        return logging.getLogger("vfm.tasks")


_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
_BAR = re.compile(r"\d+%\|.*\|")  # a tqdm bar: " 40%|████      | 4/10 [00:01<00:02, ...]"


def log_lines(text: str) -> list[str]:
    """A subprocess's output as lines fit for a Prefect log: colour codes dropped, progress-bar
    redraws (tqdm, carriage returns) left out except a finished bar, blank lines dropped."""
    out = []
    for raw in text.splitlines():  # splits at "\r" too: each redraw is its own piece
        line = _ANSI.sub("", raw).rstrip()
        if not line.strip():
            continue
        if _BAR.search(line) and not re.search(r"100%\|", line):
            continue
        out.append(line)
    return out
