"""Process-wide defaults the library sets on import (vfm_core/__init__.py, vfm_core/openmp.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from vfm_core.openmp import CHOICE_ENV, threads_for, wait_policy_for

REPO = Path(__file__).resolve().parents[1]
SHOW = (
    "import vfm_core, os, torch; print(os.environ.get('OMP_WAIT_POLICY'), "
    "os.environ.get('VFM_OMP_WAIT'), torch.get_num_threads())"
)


def _import_with(**env_values: str) -> str:
    drop = ("OMP_WAIT_POLICY", CHOICE_ENV, "OMP_NUM_THREADS", "MKL_NUM_THREADS")
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env.update(env_values)
    out = subprocess.run(
        [sys.executable, "-c", SHOW], capture_output=True, text=True, env=env, cwd=REPO, check=True
    )
    return out.stdout.strip()


def test_threads_sleep_at_barriers_only_on_a_busy_machine():
    assert wait_policy_for(6.0, 2) == "PASSIVE"  # other work fills the cores: do not spin
    assert wait_policy_for(2.0, 2) == "PASSIVE"
    assert wait_policy_for(0.5, 2) is None  # idle: OpenMP's spinning default is faster


def test_threads_take_the_cores_the_load_leaves_free():
    assert threads_for(0.3, 2) == 2  # idle: every core
    assert threads_for(1.2, 2) == 1  # one busy process beside: its core is not ours
    assert threads_for(6.0, 2) == 1  # never none
    assert threads_for(4.0, 16) == 12


def test_busy_cpus_sees_a_busy_process_beside_it():
    import time

    from vfm_core.openmp import busy_cpus

    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.5)
        assert busy_cpus(0.5) >= 0.6  # one core spinning (machine noise on top)
    finally:
        hog.kill()
        hog.wait()


def test_the_choice_is_inherited_and_the_users_kept():
    # a child of a busy start keeps sleeping threads; one of an idle start keeps the default
    # (and, busy, one intra-op thread: a second would wait for a core at every barrier)
    cpus = len(os.sched_getaffinity(0))
    assert _import_with(**{CHOICE_ENV: "passive"}) == "PASSIVE passive 1"
    assert _import_with(**{CHOICE_ENV: "passive", "OMP_NUM_THREADS": "2"}) == "PASSIVE passive 2"
    default = _import_with(**{CHOICE_ENV: "default"})
    assert default.split()[:2] == ["None", "default"] and int(default.split()[2]) <= cpus
    assert _import_with(OMP_WAIT_POLICY="ACTIVE").split()[:2] == ["ACTIVE", "None"]
    assert _import_with().split()[1] in ("passive", "default")  # recorded for the children
