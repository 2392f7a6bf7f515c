"""Preemption: a signal that asks a training run to stop ends it at a step, saved.

Slurm's preemption and ``--signal`` (SIGTERM / SIGUSR1), Kubernetes' eviction and ``scancel`` send
a signal some seconds before they kill. :class:`StopRequest` turns SIGTERM and SIGUSR1 into a flag;
the training loop asks :meth:`StopRequest.agreed` at the end of every step, which every rank
answers alike (the largest signal number over the ranks: one small all-reduce), so all ranks
stop after the same step. The loop then saves a checkpoint of that step and raises
:class:`Preempted`; the entry points log one line and exit with the signal's status
(128 + signal). ``--resume`` continues with the losses an uninterrupted run would have had.

Signal handlers belong to the main thread: elsewhere (a Prefect task's worker thread)
:class:`StopRequest` installs none and never asks the run to stop.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any

STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)


class Preempted(Exception):  # noqa: N818 (a stop asked for, not an error of the run)
    """The run stopped after ``step`` on ``signum``; ``checkpoint``: where that step is saved
    (set by the entry point once the save has finished)."""

    def __init__(self, signum: int, step: int, checkpoint: str = "") -> None:
        super().__init__(signum, step)
        self.signum, self.step, self.checkpoint = signum, step, checkpoint

    def __str__(self) -> str:
        saved = f"checkpoint {self.checkpoint} saved" if self.checkpoint else "no checkpoint"
        name = signal.Signals(self.signum).name
        return f"stopped by {name} after step {self.step}: {saved}; continue with --resume"

    @property
    def exit_code(self) -> int:
        """The status of a process the signal ended: 128 + its number (143 for SIGTERM)."""
        return 128 + self.signum


class StopRequest:
    """SIGTERM / SIGUSR1 handlers (``with StopRequest() as stop:``) that record the signal; the
    previous handlers come back on exit."""

    def __init__(self, device: Any = "cpu") -> None:
        self.signum = 0
        self.device = device
        """Where the ranks' flags meet (a CUDA device under NCCL)."""
        self.handler: Callable[[int, FrameType | None], None] = self._record
        """What a stop signal does (default: record it; a launcher forwards it too)."""
        self._previous: dict[int, object] = {}

    def __enter__(self) -> StopRequest:
        if threading.current_thread() is threading.main_thread():
            for sig in STOP_SIGNALS:
                self._previous[sig] = signal.signal(sig, self.handler)
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()

    def _record(self, signum: int, frame: FrameType | None) -> None:
        self.signum = self.signum or signum

    def agreed(self) -> int:
        """The signal every rank stops on (0: go on): this rank's, or the largest over the ranks
        under a process group — a collective, called by every rank at the same point."""
        import torch
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
            return self.signum
        flag = torch.tensor([self.signum], dtype=torch.int64, device=self.device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        self.signum = int(flag.item())
        return self.signum
