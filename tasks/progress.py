"""A Prefect progress artifact for a long step (training steps, curated videos): the run page in
the UI shows a bar that moves while the step runs, beside the log lines of :mod:`vfm_core.progress`.

Outside a flow or task run (``task.fn()`` in a test, a script) it does nothing. Updates are
throttled (at most one every ``every_s`` seconds, and always the last), and a failing API call is a
warning, never a failed run: progress is for the eye, the work is what counts.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable

from prefect.artifacts import create_progress_artifact, update_progress_artifact
from prefect.context import FlowRunContext, TaskRunContext

from tasks.logs import task_logger

_STEP = re.compile(r"^step (\d+)/(\d+)\b")


class ProgressArtifact:
    """``update(done)`` as work is done out of ``total``; the artifact holds the percentage."""

    def __init__(
        self,
        key: str,
        total: int,
        *,
        description: str,
        every_s: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.key, self.total, self.description = key, max(1, int(total)), description
        self.every_s, self.clock = every_s, clock
        self.id = None
        self._last = -float("inf")
        self._done = 0
        if FlowRunContext.get() is None and TaskRunContext.get() is None:
            return  # no run to attach it to
        try:
            self.id = create_progress_artifact(0.0, key=key, description=description)
        except Exception as e:  # noqa: BLE001 - the UI bar is optional, the work is not
            task_logger().warning("progress artifact %s not created: %s", key, e)

    @property
    def percent(self) -> float:
        return round(100.0 * min(self._done, self.total) / self.total, 1)

    def update(self, done: int) -> None:
        self._done = done
        now = self.clock()
        if self.id is None or (done < self.total and now - self._last < self.every_s):
            return
        self._last = now
        try:
            update_progress_artifact(self.id, self.percent)
        except Exception as e:  # noqa: BLE001
            task_logger().warning("progress artifact %s not updated: %s", self.key, e)

    def feed_line(self, line: str) -> None:
        """Follow a trainer's ``step i/N ...`` lines (N replaces the total it was created with)."""
        if m := _STEP.match(line.strip()):
            self.total = max(1, int(m.group(2)))
            self.update(int(m.group(1)))
