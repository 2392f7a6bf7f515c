"""Progress of a long generation loop (denoising steps, sampled tokens): the library's one
:class:`vfm_core.progress.Progress` with generation's defaults.

Nothing is shown for the first :data:`PROGRESS_DELAY_S` seconds, so a small request stays quiet.
After that: a tqdm bar on a terminal; otherwise (a log file, the output a Prefect task collects
from a generation process) one line on stderr every ``$VFM_PROGRESS_EVERY_S`` seconds (10) and at
the end, with the rate and the time left.
"""

from __future__ import annotations

import sys
from typing import TextIO

from vfm_core import progress

__all__ = ["PROGRESS_DELAY_S", "Progress"]

PROGRESS_DELAY_S = 3.0
"""Seconds a loop runs before its progress is shown."""


class Progress(progress.Progress):
    """``update()`` once per unit of ``total``; ``close()`` (or ``with``) at the end."""

    def __init__(
        self,
        total: int,
        *,
        desc: str,
        unit: str,
        enabled: bool = True,
        delay_s: float | None = None,
        file: TextIO | None = None,
    ):
        """``delay_s``: seconds before anything is shown (None: :data:`PROGRESS_DELAY_S`)."""
        super().__init__(
            total,
            desc=desc,
            unit=unit,
            enabled=enabled,
            delay_s=PROGRESS_DELAY_S if delay_s is None else delay_s,
            file=file or sys.stderr,
            bar=True,
        )
