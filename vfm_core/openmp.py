"""OpenMP's wait policy, chosen once per process tree before torch loads its OpenMP runtime
(``vfm_core/__init__.py`` calls :func:`choose_wait_policy` on import).

Torch's intra-op threads spin at every barrier for a while before they sleep (OpenMP's default).
On an idle machine that is the fastest; on one already busy with other work the spinning threads
take the cores from the threads they wait for. Measured on this 2-core machine
(``benchmarks/omp_wait.py``, training steps/s, interleaved in one run):

============================  ==================  ===================
                              idle (load 0.5)     busy (load ~6)
============================  ==================  ===================
tok-tiny, OpenMP default      37.0                1.9-2.2
tok-tiny, PASSIVE             24.8 (0.67x)        9.3
dit-tiny, OpenMP default      6.9                 0.22
dit-tiny, PASSIVE             4.6 (0.66x)         2.9
============================  ==================  ===================

So ``OMP_WAIT_POLICY=PASSIVE`` is set only when the machine is busy when vfm starts (the 1-minute
load average at least the CPUs this process may use), and the choice is recorded in
``VFM_OMP_WAIT`` so that the processes vfm starts (torchrun ranks, tasks) keep it rather than
reading a load vfm itself makes. A policy set in the environment is never changed; imported
after torch, this changes nothing (set the variable yourself then).
"""

from __future__ import annotations

import os

__all__ = ["CHOICE_ENV", "choose_wait_policy", "wait_policy_for"]

CHOICE_ENV = "VFM_OMP_WAIT"
"""Where the choice is recorded for child processes: ``passive`` or ``default``."""


def wait_policy_for(load: float, cpus: int) -> str | None:
    """``PASSIVE`` when a 1-minute ``load`` fills the ``cpus``, else None (OpenMP's default)."""
    return "PASSIVE" if load >= cpus else None


def _usable_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def choose_wait_policy() -> str | None:
    """Set ``OMP_WAIT_POLICY`` for this process and its children (see the module's docstring);
    returns what is in effect (None: OpenMP's default)."""
    if "OMP_WAIT_POLICY" in os.environ:
        return os.environ["OMP_WAIT_POLICY"]
    if CHOICE_ENV not in os.environ:
        try:
            load = os.getloadavg()[0]
        except OSError:  # no load average on this platform
            load = 0.0
        chosen = wait_policy_for(load, _usable_cpus())
        os.environ[CHOICE_ENV] = "passive" if chosen else "default"
    if os.environ[CHOICE_ENV] == "passive":
        os.environ["OMP_WAIT_POLICY"] = "PASSIVE"
        return "PASSIVE"
    return None
