"""Progress of a long generation loop (denoising steps, sampled tokens) on stderr.

Nothing is shown for the first :data:`PROGRESS_DELAY_S` seconds, so a small request stays
quiet. After that: a tqdm bar on a terminal; otherwise (a log file, a Prefect task) one line every
~10 % of the work, or every minute, with the rate and the time left.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO

from tqdm import tqdm

__all__ = ["PROGRESS_DELAY_S", "Progress"]

PROGRESS_DELAY_S = 3.0
"""Seconds a loop runs before its progress is shown."""


class Progress:
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
        delay = PROGRESS_DELAY_S if delay_s is None else delay_s
        self.total, self.desc, self.unit, self.delay = total, desc, unit, delay
        self.file = file or sys.stderr
        self.enabled = enabled and total > 0
        self.n, self.t0, self.next_line, self.last_line = 0, time.perf_counter(), 0, 0.0
        self.bar = None
        if self.enabled and self.file.isatty():
            self.bar = tqdm(
                total=total, desc=desc, unit=unit, delay=delay, file=self.file, dynamic_ncols=True
            )

    def update(self, n: int = 1) -> None:
        self.n += n
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.update(n)
            return
        elapsed = time.perf_counter() - self.t0
        due = self.n >= self.next_line or elapsed - self.last_line >= 60 or self.n == self.total
        if elapsed < self.delay or not due:
            return
        rate = self.n / max(elapsed, 1e-9)
        left = (self.total - self.n) / rate if rate > 0 else float("inf")
        print(
            f"{self.desc}: {self.n}/{self.total} {self.unit}s ({self.n / self.total:.0%}), "
            f"{elapsed:.0f} s, {rate:.3g} {self.unit}/s, about {left:.0f} s left",
            file=self.file,
            flush=True,
        )
        self.next_line = self.n + max(1, self.total // 10)
        self.last_line = elapsed

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
