"""A flow started from a terminal (``make demo``, ``python -m flows.curate SRC DST``): Ctrl-C ends
it with one line.

Without this, an interrupt prints Prefect's crash lines for each running task and flow, the
traceback of the sleeping call, and whatever the background threads (Prefect's events and log
workers, Ray, the temporary API server) report while the process is torn down.
:func:`run_main` silences the logging as soon as the signal arrives (Prefect still marks the runs
``Crashed`` through its API), prints ``<name>: interrupted`` and exits 130, the shell's code for
an interrupt; the interpreter's clean-up (the temporary server stopped) runs with its output
discarded. A second Ctrl-C during that clean-up kills the process as usual."""

from __future__ import annotations

import logging
import os
import signal
import sys
from collections.abc import Callable
from typing import NoReturn

__all__ = ["run_main"]

INTERRUPTED = 130
"""Exit status of a run ended by Ctrl-C (128 + SIGINT)."""


def _quiet_on_interrupt(signum, frame) -> None:  # noqa: ARG001 (a signal handler's signature)
    """First Ctrl-C: no more log records from anyone, then the usual KeyboardInterrupt; the next
    one gets Python's default handler."""
    logging.disable(logging.CRITICAL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    raise KeyboardInterrupt


def _discard_output() -> None:
    """Point stdout and stderr at /dev/null: what the threads and exit handlers print while the
    process ends goes nowhere."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    null = os.open(os.devnull, os.O_WRONLY)
    for fd in (1, 2):
        os.dup2(null, fd)


def run_main(main: Callable[[], object], *, name: str, hint: str = "") -> NoReturn:
    """Run ``main`` (a flow module's entry point) and exit with its status (an int; anything
    else, such as a flow's summary: 0); Ctrl-C
    prints ``<name>: interrupted[: hint]`` on stderr, alone, and exits 130."""
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:  # not ignored (nohup, &)
        signal.signal(signal.SIGINT, _quiet_on_interrupt)
    try:
        rc = main()
    except KeyboardInterrupt:
        logging.disable(logging.CRITICAL)
        print(f"\n{name}: interrupted{': ' + hint if hint else ''}", file=sys.stderr, flush=True)
        _discard_output()
        sys.exit(INTERRUPTED)
    sys.exit(rc if isinstance(rc, int) and not isinstance(rc, bool) else 0)
