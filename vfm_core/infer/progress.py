"""Progress of a long generation loop (denoising steps, sampled tokens): the library's one
:class:`vfm_core.progress.Progress` with generation's defaults.

Nothing is shown for the first :data:`PROGRESS_DELAY_S` seconds, so a small request stays quiet.
After that: a tqdm bar on a terminal; otherwise one line every ``$VFM_PROGRESS_EVERY_S`` seconds
(10) and at the end, with the rate and the time left, through the library's logger: on the stderr
of ``vfm generate`` and of the ranks a launcher collects, in the run's log under Prefect.
"""

from __future__ import annotations

import logging
from typing import TextIO

from vfm_core import progress

__all__ = ["PROGRESS_DELAY_S", "Progress"]

PROGRESS_DELAY_S = 3.0
"""Seconds a loop runs before its progress is shown."""

_log = logging.getLogger(__name__)


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
        """``delay_s``: seconds before anything is shown (None: :data:`PROGRESS_DELAY_S`);
        ``file``: print the lines there instead of logging them."""
        super().__init__(
            total,
            desc=desc,
            unit=unit,
            enabled=enabled,
            delay_s=PROGRESS_DELAY_S if delay_s is None else delay_s,
            logger=_log,
            file=file,
            bar=True,
        )
