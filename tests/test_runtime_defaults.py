"""Process-wide defaults the library sets on import (vfm_core/__init__.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SHOW = "import vfm_core, os; print(os.environ['OMP_WAIT_POLICY'])"


def _policy(env_value: str | None) -> str:
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    if env_value is not None:
        env["OMP_WAIT_POLICY"] = env_value
    out = subprocess.run(
        [sys.executable, "-c", SHOW], capture_output=True, text=True, env=env, cwd=REPO, check=True
    )
    return out.stdout.strip()


def test_openmp_threads_sleep_at_barriers_unless_the_user_chose():
    assert _policy(None) == "PASSIVE"  # before torch loads OpenMP: threads do not spin
    assert _policy("ACTIVE") == "ACTIVE"
