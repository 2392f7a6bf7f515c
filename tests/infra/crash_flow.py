"""The smallest two-stage flow for tests/infra/test_worker_crash_e2e.py: ``prepare`` (cached on
its inputs, result persisted) then ``work``, which holds until told to go on. Each stage appends
its process id to ``RUN_DIR/<stage>.log`` so the test sees which stages ran, and where."""

from __future__ import annotations

import os
import time
from pathlib import Path

from prefect import flow, task
from prefect.cache_policies import INPUTS


@task(cache_policy=INPUTS, persist_result=True)
def prepare(run_dir: str) -> str:
    with (Path(run_dir) / "prepare.log").open("a") as f:
        f.write(f"{os.getpid()}\n")
    return "prepared"


@task(cache_policy=INPUTS, persist_result=True)
def work(run_dir: str, prepared: str, hold_s: float) -> str:
    with (Path(run_dir) / "work.log").open("a") as f:
        f.write(f"{os.getpid()}\n")
    time.sleep(hold_s)  # the test kills the worker and this process meanwhile
    return f"{prepared}, worked"


@flow(name="crash-resume", log_prints=True)
def crash_resume(run_dir: str, hold_s: float = 0.0) -> str:
    return work(run_dir, prepare(run_dir), hold_s)
