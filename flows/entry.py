"""A flow started from a terminal (``make demo``, ``python -m flows.curate SRC DST``): Ctrl-C (or
SIGTERM, e.g. from ``timeout`` or ``kill``) ends it with one line, its clean-up done.

Without this, an interrupt prints Prefect's crash lines for each running task and flow, the
traceback of the sleeping call, and whatever the background threads (Prefect's events and log
workers, Ray, the temporary API server) report while the process is torn down.
:func:`run_main` silences the logging as soon as the signal arrives (Prefect still marks the runs
``Crashed`` through its API), prints ``<name>: interrupted`` and exits 130, the shell's code for
an interrupt; the interpreter's clean-up (the temporary server stopped) runs with its output
discarded. A second Ctrl-C during that clean-up kills the process as usual. SIGTERM takes the same
path (``<name>: terminated``, exit 143 = 128 + SIGTERM): killed by its default action instead,
the process would leave the temporary API server it started running."""

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
TERMINATED = 143
"""Exit status of a run ended by SIGTERM (128 + SIGTERM)."""


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where Ctrl-C raises KeyboardInterrupt, so that the run ends the same way
    (Prefect marks it ``Crashed``; the clean-up runs)."""


def _quiet_on_interrupt(signum, frame) -> None:  # noqa: ARG001 (a signal handler's signature)
    """First Ctrl-C: no more log records from anyone, then the usual KeyboardInterrupt; the next
    one gets Python's default handler."""
    logging.disable(logging.CRITICAL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    raise KeyboardInterrupt


def _quiet_on_terminate(signum, frame) -> None:  # noqa: ARG001 (a signal handler's signature)
    """SIGTERM: as the first Ctrl-C, raising `Terminated`; a second one kills as usual."""
    logging.disable(logging.CRITICAL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    raise Terminated


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
    prints ``<name>: interrupted[: hint]`` on stderr, alone, and exits 130; SIGTERM prints
    ``<name>: terminated[: hint]`` and exits 143."""
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:  # not ignored (nohup, &)
        signal.signal(signal.SIGINT, _quiet_on_interrupt)
    if signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _quiet_on_terminate)
    try:
        rc = main()
    except KeyboardInterrupt as e:
        logging.disable(logging.CRITICAL)
        how = "terminated" if isinstance(e, Terminated) else "interrupted"
        print(f"\n{name}: {how}{': ' + hint if hint else ''}", file=sys.stderr, flush=True)
        _discard_output()
        sys.exit(TERMINATED if isinstance(e, Terminated) else INTERRUPTED)
    sys.exit(rc if isinstance(rc, int) and not isinstance(rc, bool) else 0)
