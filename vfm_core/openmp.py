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
load average at least the CPUs this process may use: its CPU affinity, capped by a cgroup CPU
quota). Whatever the policy, torch gets only the cores that other work leaves free right now
(``OMP_NUM_THREADS``, :func:`threads_for` of :func:`busy_cpus`, sampled for a quarter second; one
at least): a thread on a core that other work holds mostly waits at every barrier for it (the
tokenizer's step at a load of ~2.8 on these 2 cores: 58 ms with one thread, 76 ms with two
sleeping, 335 ms with two spinning; before this rule, a demo started beside one busy
single-threaded process spent 407 s in its tokenizer stage with two spinning threads, against
~50 s alone). The choice is recorded in ``VFM_OMP_WAIT`` and ``OMP_NUM_THREADS`` so that the
processes vfm starts (torchrun ranks, tasks) keep it rather than reading a load vfm itself makes.
The rule as a whole (``benchmarks/omp_wait.py``, "vfm's rule", median of 2 interleaved rounds):
beside one busy process it chose one thread, and tok-tiny ran 27.0 steps/s against 7.9 with
OpenMP's default (3.4x), dit-tiny 3.9 against 1.8 (2.2x); idle it keeps both threads and the
default policy, which is OpenMP's default.
A policy or a thread count set in the environment is never changed; imported after torch, this
changes nothing (set the variables yourself then).
"""

from __future__ import annotations

import os

__all__ = [
    "CHOICE_ENV",
    "busy_cpus",
    "choose_wait_policy",
    "threads_for",
    "usable_cpus",
    "wait_policy_for",
]

CHOICE_ENV = "VFM_OMP_WAIT"
"""Where the choice is recorded for child processes: ``passive`` or ``default``."""


def wait_policy_for(load: float, cpus: int) -> str | None:
    """``PASSIVE`` when a 1-minute ``load`` fills the ``cpus``, else None (OpenMP's default)."""
    return "PASSIVE" if load >= cpus else None


def threads_for(load: float, cpus: int) -> int:
    """Intra-op threads for the ``cpus`` that ``load`` (CPUs busy with other work) leaves free (at
    least one; a load from 0.75 counts as a core taken)."""
    return max(1, cpus - int(load + 0.25))


def usable_cpus() -> int:
    """The CPUs this process may run on (affinity), capped by a cgroup v2 CPU quota."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    try:
        quota, period = open("/sys/fs/cgroup/cpu.max").read().split()[:2]
        if quota != "max":
            cpus = min(cpus, max(1, -(-int(quota) // int(period))))  # ceil
    except (OSError, ValueError):
        pass
    return cpus


def _load_average() -> float:
    """The 1-minute load average (0 on a platform without one)."""
    try:
        return os.getloadavg()[0]
    except OSError:
        return 0.0


def _cpu_times() -> tuple[int, int]:
    """(busy, total) jiffies of all CPUs since boot, from ``/proc/stat``."""
    with open("/proc/stat") as f:
        fields = [int(v) for v in f.readline().split()[1:9]]
    idle = fields[3] + fields[4]  # idle, iowait
    return sum(fields) - idle, sum(fields)


def busy_cpus(seconds: float = 0.25) -> float:
    """CPUs kept busy by other work right now: the machine's busy share over ``seconds`` (this
    process sleeps meanwhile) times its CPUs; the 1-minute load average where ``/proc/stat`` is
    missing. Not the load average itself: it still counts work that just ended (a ``make demo``
    right after its install read ~1.0 on an idle machine)."""
    import time

    try:
        busy0, total0 = _cpu_times()
        time.sleep(seconds)
        busy1, total1 = _cpu_times()
    except (OSError, ValueError, IndexError):
        return _load_average()
    share = (busy1 - busy0) / max(total1 - total0, 1)
    return share * (os.cpu_count() or 1)


def choose_wait_policy() -> str | None:
    """Set ``OMP_WAIT_POLICY`` and the thread count for this process and its children (see the
    module's docstring); returns the policy in effect (None: OpenMP's default)."""
    if "OMP_WAIT_POLICY" in os.environ:
        return os.environ["OMP_WAIT_POLICY"]
    if CHOICE_ENV not in os.environ:
        cpus = usable_cpus()
        chosen = wait_policy_for(_load_average(), cpus)
        os.environ[CHOICE_ENV] = "passive" if chosen else "default"
        if "OMP_NUM_THREADS" not in os.environ:
            threads = threads_for(busy_cpus(), cpus)
            if threads < cpus:  # inherited by the children with the policy
                os.environ["OMP_NUM_THREADS"] = str(threads)
    if os.environ[CHOICE_ENV] == "passive":
        os.environ["OMP_WAIT_POLICY"] = "PASSIVE"
        os.environ.setdefault("OMP_NUM_THREADS", "1")
        return "PASSIVE"
    return None
