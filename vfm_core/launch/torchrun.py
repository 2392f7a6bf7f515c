"""``torchrun`` (``torch.distributed.run``) whose stop signal ends in one line.

torchrun passes SIGTERM to the ranks, which finish their step, save and say so in one line
(:mod:`vfm_core.launch.preempt`); then torchrun itself raises ``SignalException`` and prints its
traceback. Run as ``python -m vfm_core.launch.torchrun ARGS`` (the ``torchrun`` arguments): the
same launcher, exiting with the signal's status (128 + signal) instead.
"""

from __future__ import annotations

import sys

from torch.distributed.elastic.multiprocessing.api import SignalException
from torch.distributed.run import main


def run() -> int:
    try:
        main()
    except SignalException as e:  # the ranks got the signal from torchrun and said what they did
        return 128 + int(e.sigval)
    return 0


if __name__ == "__main__":
    sys.exit(run())
