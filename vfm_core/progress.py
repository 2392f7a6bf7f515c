"""Progress of a long loop, one line at a steady rate: ``<what>: i/n units (x%), elapsed, rate,
about <eta> left``.

Lines go through :mod:`logging` (logger ``vfm_core.progress`` unless the caller names its own), at
most one every :data:`PROGRESS_EVERY_S` seconds (``$VFM_PROGRESS_EVERY_S`` overrides it) and one at
the end, so a terminal, a log file and a Prefect run log all show the same thing: the flows add
``vfm_core`` to ``PREFECT_LOGGING_EXTRA_LOGGERS`` (:func:`vfm_core.infra_env.prefect_logs_library`)
and the ``vfm`` command prints the library's INFO lines on stderr (:func:`console_logging`).

``file=`` prints the lines to a stream instead (generation: the stderr of a process whose output
its caller collects); ``bar=True`` shows a tqdm bar instead of lines when that stream (default
stderr) is a terminal. ``delay_s``: nothing is shown before then, so a short loop stays quiet.
"""

from __future__ import annotations

import logging
import math
import os
import sys
import time
import warnings
from collections.abc import Callable
from typing import TextIO

__all__ = ["PROGRESS_EVERY_S", "MediaProgress", "Progress", "console_logging", "format_duration"]

PROGRESS_EVERY_S = 10.0
"""Seconds between two progress lines of one loop (default of ``every_s``)."""
EVERY_ENV = "VFM_PROGRESS_EVERY_S"

_log = logging.getLogger("vfm_core.progress")


def format_duration(s: float) -> str:
    """``42 s``, ``3 min 20 s``, ``2 h 05 min`` (``?`` for an unknown duration)."""
    if not math.isfinite(s):
        return "?"
    s = max(0, round(s))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s // 3600} h {s % 3600 // 60:02d} min"


def _plural(unit: str) -> str:
    return unit + ("es" if unit.endswith(("s", "x", "ch", "sh")) else "s")


def _every_s(every_s: float | None) -> float:
    if every_s is not None:
        return every_s
    raw = os.environ.get(EVERY_ENV)
    if raw is None:
        return PROGRESS_EVERY_S
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < 0:
        warnings.warn(
            f"{EVERY_ENV}={raw!r}: expected seconds >= 0; using {PROGRESS_EVERY_S:g}",
            stacklevel=3,
        )
        return PROGRESS_EVERY_S
    return value


class Progress:
    """``update(n)`` as work is done; ``close()`` (or ``with``) at the end. ``total`` None: a
    count and a rate, no percentage or time left."""

    def __init__(
        self,
        total: int | None,
        *,
        desc: str,
        unit: str = "item",
        enabled: bool = True,
        every_s: float | None = None,
        delay_s: float = 0.0,
        logger: logging.Logger | None = None,
        file: TextIO | None = None,
        bar: bool = False,
        clock: Callable[[], float] = time.monotonic,
    ):
        """``every_s``: seconds between lines (None: ``$VFM_PROGRESS_EVERY_S`` or
        :data:`PROGRESS_EVERY_S`); ``clock``: seconds, monotonic (tests pass their own)."""
        self.total, self.desc, self.unit = total, desc, unit
        self.every, self.delay, self.clock = _every_s(every_s), delay_s, clock
        self.logger, self.file = logger or _log, file
        self.enabled = enabled and (total is None or total > 0)
        self.n, self.t0, self.last_line, self.lines, self.logged = 0, clock(), 0.0, 0, 0
        self.finished, self.note = False, ""
        self.bar = None
        stream = file or sys.stderr
        if self.enabled and bar and stream.isatty():
            from tqdm import tqdm

            self.bar = tqdm(
                total=total, desc=desc, unit=unit, delay=delay_s, file=stream, dynamic_ncols=True
            )

    def update(self, n: int = 1, *, note: str | None = None) -> None:
        """``n`` more units done; a line when the last one is ``every_s`` old or all are done.
        ``note``: shown at the end of the lines from now on (``loss 0.0412``)."""
        self.n += n
        if note is not None:
            self.note = note
        if not self.enabled or self.finished:
            return
        if self.bar is not None:
            if note is not None:
                self.bar.set_postfix_str(note, refresh=False)
            self.bar.update(n)
            return
        elapsed = self.clock() - self.t0
        done = self.total is not None and self.n >= self.total
        if elapsed >= self.delay and (done or elapsed - self.last_line >= self.every):
            self._line(elapsed)
            self.finished = done

    def close(self) -> None:
        """The last line (unless the loop ended before ``delay_s`` and showed nothing)."""
        if self.bar is not None:
            self.bar.close()
            self.bar = None
        elif self.enabled and not self.finished:
            elapsed = self.clock() - self.t0
            if self.n > self.logged and (elapsed >= self.delay or self.lines):
                self._line(elapsed)
        self.finished = True

    def _line(self, elapsed: float) -> None:
        rate = self.n / elapsed if elapsed > 0 else math.inf
        units = self.unit if self.n == 1 else _plural(self.unit)
        if self.total is None:
            head = f"{self.desc}: {self.n} {units}"
        else:
            head = f"{self.desc}: {self.n}/{self.total} {units} ({self.n / self.total:.0%})"
        left = (self.total - self.n) / rate if self.total is not None and rate > 0 else math.nan
        text = f"{head}, {format_duration(elapsed)}, {rate:.3g} {self.unit}/s"
        if self.total is not None:
            text += f", about {format_duration(left)} left"
        self._emit(text, elapsed)

    def _emit(self, text: str, elapsed: float) -> None:
        """Show one line (with the note) on the stream or through the logger."""
        if self.note:
            text += f", {self.note}"
        if self.file is not None:
            print(text, file=self.file, flush=True)
        else:
            console_logging()
            self.logger.info(text)
        self.last_line, self.lines, self.logged = elapsed, self.lines + 1, self.n

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class MediaProgress(Progress):
    """Progress through a video's timeline: ``at(t)`` with the media time reached (seconds);
    lines read ``<desc>: 60/193 s of video (31%), 20 s, 2.9x realtime, about 45 s left``
    (the rate is media seconds per wall second since ``start_s``, the first position).
    ``total_s`` None or <= 0: nothing is shown; ``delay_s`` defaults to ``every_s``."""

    def __init__(self, total_s: float | None, *, desc: str, start_s: float = 0.0, **kw) -> None:
        total = total_s if total_s is not None and total_s > 0 else 0
        quiet = "delay_s" not in kw
        super().__init__(total, desc=desc, unit="s", **kw)  # type: ignore[arg-type]
        self.start_s, self.n = start_s, start_s
        if quiet:  # a video done within one interval shows nothing
            self.delay = self.every

    def at(self, t: float) -> None:
        """The media time `t` (seconds) is reached (earlier times are ignored)."""
        if t > self.n:
            self.update(t - self.n)  # type: ignore[arg-type]

    def _line(self, elapsed: float) -> None:
        done = self.n - self.start_s
        rate = done / elapsed if elapsed > 0 else math.inf
        total = float(self.total or 0)
        left = (total - self.n) / rate if rate > 0 else math.nan
        self._emit(
            f"{self.desc}: {self.n:.0f}/{total:.0f} s of video ({self.n / total:.0%}), "
            f"{format_duration(elapsed)}, {rate:.2g}x realtime, about {format_duration(left)} left",
            elapsed,
        )


def console_logging() -> None:
    """Let the library's INFO lines (progress) be seen: the ``vfm_core`` logger at INFO unless a
    level was set for it, and a plain stderr handler when no handler at all would show them
    (a script or the ``vfm`` command; under Prefect or pytest the root's handlers do)."""
    lib = logging.getLogger("vfm_core")
    if lib.level == logging.NOTSET:
        lib.setLevel(logging.INFO)
    if not lib.handlers and not logging.getLogger().handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(message)s"))
        lib.addHandler(handler)
