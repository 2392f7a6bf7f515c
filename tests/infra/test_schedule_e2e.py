"""Schedules end to end on a real ``prefect server start`` (not the test harness): a deployment with
an interval schedule -> the server's scheduler service creates its scheduled runs -> the process
worker runs one to Completed -> the server log holds no scheduler error.

Under SQLAlchemy 2.1 Prefect 3.8.8's scheduler fails on every loop (``InvalidRequestError: Can't
evaluate bulk DML statement`` in ``_insert_scheduled_flow_runs``) and never creates a run, so a
deployment such as ``curate-nightly`` never runs: pyproject pins ``sqlalchemy<2.1``."""

from __future__ import annotations

import contextlib
import os
import sys
import time
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from infra.load import api as _api
from infra.load import deploy
from infra.load import free_port as _free_port

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
FLOW = "schedule-tick"  # @flow(name=...) in tests/infra/schedule_flow.py
DEPLOYMENT = "every-ten-seconds"
INTERVAL_S = 10
FINAL = ("COMPLETED", "FAILED", "CRASHED", "CANCELLED")

# The server's scheduler loops every 2 s instead of 60 s (setting names from prefect 3.8.8's
# ServerServicesSchedulerSettings) and keeps at most 3 runs ahead; the worker polls every 2 s.
FAST = {
    "PREFECT_SERVER_SERVICES_SCHEDULER_LOOP_SECONDS": "2",
    "PREFECT_SERVER_SERVICES_SCHEDULER_RECENT_DEPLOYMENTS_LOOP_SECONDS": "2",
    "PREFECT_SERVER_SERVICES_SCHEDULER_MIN_RUNS": "1",
    "PREFECT_SERVER_SERVICES_SCHEDULER_MAX_RUNS": "3",
    "PREFECT_WORKER_QUERY_SECONDS": "2",
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    "HF_HUB_OFFLINE": "1",
}

PREFECT_YAML = f"""\
name: vfm-schedule-e2e
prefect-version: 3.8.8
pull:
  - prefect.deployments.steps.set_working_directory:
      directory: "{REPO}"
deployments:
  - name: {DEPLOYMENT}
    entrypoint: tests/infra/schedule_flow.py:tick
    work_pool:
      name: {{pool}}
      work_queue_name: default
    schedules:
      - interval: {INTERVAL_S}
        active: true
"""


def _time(stamp: str) -> datetime:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00"))


def quiesce(api: str, pool: str) -> None:
    """Pause the pool, then wait (bounded) for the runs the worker already started: each flow run
    is a session of its own, outside the worker's process group that down() kills."""

    busy = {
        "work_pools": {"name": {"any_": [pool]}},
        "flow_runs": {"state": {"type": {"any_": ["PENDING", "RUNNING", "CANCELLING"]}}},
    }
    with contextlib.suppress(OSError, ValueError):  # the server may be gone already
        if _api("PATCH", f"{api}/work_pools/{pool}", {"is_paused": True})[0] != 204:
            return
        deadline = time.monotonic() + 60
        while _api("POST", f"{api}/flow_runs/filter", busy)[1] and time.monotonic() < deadline:
            time.sleep(1)


@pytest.fixture
def server_and_worker(tmp_path, monkeypatch):
    """``prefect server start`` on a free loopback port and a process worker on its own pool, both
    started (and stopped, process groups killed) by infra/services.py; PREFECT_HOME in tmp_path."""

    from infra.services import Settings, down, up

    for key, value in FAST.items():
        monkeypatch.setenv(key, value)
    s = Settings(run_dir=tmp_path / "infra", prefect_port=_free_port(), pool="vfm-schedule-e2e")
    monkeypatch.setenv("PREFECT_API_AUTH_STRING", s.secrets().prefect_auth)  # infra.load.api's
    try:
        up(s, ["prefect", "worker"], timeout=180)
        env = dict(os.environ, **s.client_env(), PREFECT_HOME=str(tmp_path / "client-prefect"))
        yield s, env
    finally:
        quiesce(s.prefect_api, s.pool)
        down(s)


@pytest.mark.slow
def test_scheduler_creates_runs_and_worker_completes_one(server_and_worker, tmp_path):

    s, env = server_and_worker
    api = s.prefect_api
    server_log = s.run_dir / "prefect.log"
    worker_log = s.run_dir / "worker.log"

    def server_errors() -> list[str]:
        """Error lines of the server log, and one "Traceback" per traceback they do not explain.
        sqlite lock contention is left out: on a loaded machine a request that upgrades a read
        to a write fails at once with "database is locked" (Prefect's sqlite store, WAL mode; a
        worker heartbeat, retried by the worker), which is not the scheduler failing."""
        lines = server_log.read_text(errors="replace").splitlines()
        locked = sum("database is locked" in x and "Error" in x for x in lines)
        tracebacks = sum("Traceback" in x for x in lines)
        other = [
            x
            for x in lines
            if "Error" in x and "Traceback" not in x and "database is locked" not in x
        ]
        return other + ["Traceback"] * max(0, tracebacks - locked)

    def logs() -> str:
        errors = "\n".join(server_errors()[-12:])
        return (
            f"\n--- server log: errors ---\n{errors}"
            f"\n--- server log: tail ---\n{server_log.read_text(errors='replace')[-1500:]}"
            f"\n--- worker log: tail ---\n{worker_log.read_text(errors='replace')[-3000:]}"
        )

    def runs() -> list[dict]:
        code, found = _api(
            "POST",
            f"{api}/flow_runs/filter",
            {
                "flow_runs": {"deployment_id": {"any_": [dep["id"]]}},
                "sort": "EXPECTED_START_TIME_ASC",
                "limit": 50,
            },
        )
        assert code == 200, found
        return found

    prefect_yaml = tmp_path / "prefect.yaml"
    prefect_yaml.write_text(PREFECT_YAML.replace("{pool}", s.pool))
    code, health = _api("GET", f"{api}/health")
    assert code == 200, health
    deployed_at = datetime.now().astimezone()
    deploy(prefect_yaml, env)
    # a loaded 2-core machine (the whole suite) can keep the server's answer past 30 s
    code, dep = _api("GET", f"{api}/deployments/name/{FLOW}/{DEPLOYMENT}", timeout=120)
    assert code == 200, dep
    assert [x["schedule"].get("interval") for x in dep["schedules"]] == [INTERVAL_S], dep

    # (a) the scheduler service (not the deploy call) creates the deployment's scheduled runs
    deadline = time.monotonic() + 60
    scheduled = []
    while not scheduled and time.monotonic() < deadline:
        scheduled = [r for r in runs() if r["auto_scheduled"]]
        if not scheduled:
            failing = "InvalidRequestError" in server_log.read_text(errors="replace")
            assert not failing, f"the scheduler fails, no scheduled run for {DEPLOYMENT}{logs()}"
            time.sleep(1)
    assert scheduled, f"no scheduled run for {DEPLOYMENT} after 60 s{logs()}"
    assert any(r["state"]["type"] == "SCHEDULED" for r in scheduled), scheduled
    for r in scheduled:  # due or in the future, on the interval, never before the deployment
        start = _time(r["expected_start_time"])
        assert start >= deployed_at - timedelta(seconds=INTERVAL_S), (r, deployed_at)
        assert start <= datetime.now().astimezone() + timedelta(seconds=4 * INTERVAL_S), r

    # (b) the worker picks a scheduled run up and runs the flow to Completed
    deadline = time.monotonic() + 120
    states: dict[str, str] = {}
    while "COMPLETED" not in states.values() and time.monotonic() < deadline:
        states = {r["id"]: r["state"]["type"] for r in runs() if r["auto_scheduled"]}
        bad = {k: v for k, v in states.items() if v in FINAL and v != "COMPLETED"}
        assert not bad, f"scheduled run(s) ended {bad}{logs()}"
        time.sleep(1)
    assert "COMPLETED" in states.values(), f"no scheduled run completed: {states}{logs()}"
    done = next(k for k, v in states.items() if v == "COMPLETED")
    code, run = _api("GET", f"{api}/flow_runs/{done}")
    assert code == 200 and run["deployment_id"] == dep["id"], run
    assert run["work_pool_name"] == s.pool, run

    # (c) the scheduler ran its loops (every 2 s) without an error
    assert server_errors() == [], logs()
