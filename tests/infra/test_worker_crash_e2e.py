"""The Prefect worker killed mid-flow (#27 part 2, c), on a real ``prefect server start`` and
process worker (infra/services.py): the worker and the flow run's process are SIGKILLed while the
second of two stages runs (a node lost). With flow-run heartbeats on and the server automation of
:func:`infra.services.crash_silent_flow_runs`, the server marks the run CRASHED; a new run of the
deployment on a new worker takes the finished stage from Prefect's cache (persisted result) and
runs only the stage that did not finish."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import pytest

from infra.load import api as _api
from infra.load import create_flow_run, deploy
from infra.load import free_port as _free_port

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
FINAL = ("COMPLETED", "FAILED", "CRASHED", "CANCELLED")
WITHIN_S = 40  # heartbeats every 30 s (Prefect's minimum): silent 40 s -> CRASHED

PREFECT_YAML = """\
name: vfm-crash-e2e
prefect-version: 3.8.8
pull:
  - prefect.deployments.steps.set_working_directory:
      directory: "{repo}"
deployments:
  - name: crash
    entrypoint: tests/infra/crash_flow.py:crash_resume
    work_pool:
      name: {pool}
      work_queue_name: default
"""


@pytest.fixture
def server_and_worker(tmp_path, monkeypatch):

    from infra.services import HEARTBEAT_S, Settings, down, up

    for key, value in {
        "PREFECT_WORKER_QUERY_SECONDS": "2",
        "PREFECT_FLOWS_HEARTBEAT_FREQUENCY": str(HEARTBEAT_S),
        "PREFECT_SERVER_EVENTS_PROACTIVE_GRANULARITY": "PT5S",
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    }.items():
        monkeypatch.setenv(key, value)
    s = Settings(run_dir=tmp_path / "infra", prefect_port=_free_port(), pool="vfm-crash-e2e")
    monkeypatch.setenv("PREFECT_API_AUTH_STRING", s.secrets().prefect_auth)  # infra.load.api's
    try:
        up(s, ["prefect", "worker"], timeout=180)
        env = dict(os.environ, **s.client_env(), PREFECT_HOME=str(tmp_path / "client-prefect"))
        yield s, env
    finally:
        down(s)


def _wait_state(api: str, run_id: str, want: tuple[str, ...], timeout: float) -> dict:

    deadline = time.monotonic() + timeout
    run = _api("GET", f"{api}/flow_runs/{run_id}")[1]
    while run["state"]["type"] not in want and time.monotonic() < deadline:
        time.sleep(2)
        run = _api("GET", f"{api}/flow_runs/{run_id}")[1]
    return run


def _heartbeat_seen(api: str, run_id: str, timeout: float) -> bool:
    """Whether the server recorded a heartbeat event of the flow run within `timeout` s. The
    crash automation starts watching a run at its first heartbeat; on a busy machine the first
    one can be dropped (the client's events worker gives up while the sqlite store is locked)
    and the next comes HEARTBEAT_S later."""

    body = {
        "filter": {
            "event": {"name": ["prefect.flow-run.heartbeat"]},
            "resource": {"id": [f"prefect.flow-run.{run_id}"]},
        },
        "limit": 1,
    }
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        code, found = _api("POST", f"{api}/events/filter", body)
        if code == 200 and found.get("events"):
            return True
        time.sleep(2)
    return False


@pytest.mark.slow
def test_killed_worker_run_is_crashed_and_a_rerun_resumes(server_and_worker, tmp_path):

    from infra.services import HEARTBEAT_S, crash_silent_flow_runs, read_services, up

    s, env = server_and_worker
    api = s.prefect_api
    crash_silent_flow_runs(api, within_s=WITHIN_S)
    (tmp_path / "prefect.yaml").write_text(PREFECT_YAML.format(repo=REPO, pool=s.pool))
    deploy(tmp_path / "prefect.yaml", env)
    code, dep = _api("GET", f"{api}/deployments/name/crash-resume/crash", timeout=120)
    assert code == 200, dep
    run_dir = tmp_path / "stages"
    run_dir.mkdir()
    worker_log = s.run_dir / "worker.log"

    def start(hold_s: float) -> dict:
        body = {"parameters": {"run_dir": str(run_dir), "hold_s": hold_s}}
        return create_flow_run(api, dep["id"], body)[0]  # a 503 of a busy server: sent again

    first = start(600)
    deadline = time.monotonic() + 180
    while not (run_dir / "work.log").exists() and time.monotonic() < deadline:
        time.sleep(1)
    assert (run_dir / "work.log").exists(), worker_log.read_text()[-3000:]
    # the automation watches a run from its first heartbeat on: wait until the server has one
    seen = _heartbeat_seen(api, first["id"], timeout=3 * HEARTBEAT_S)
    assert seen, worker_log.read_text()[-3000:]
    time.sleep(3)  # the trigger consumer sees the same event as the event store
    # the node is lost: the worker and the flow run's process (a session of its own) die
    flow_pid = int((run_dir / "work.log").read_text().split()[0])
    worker_pid = int(read_services(s.run_dir)["services"]["worker"]["pid"])
    os.killpg(worker_pid, signal.SIGKILL)
    os.killpg(os.getpgid(flow_pid), signal.SIGKILL)

    crashed = _wait_state(api, first["id"], FINAL, timeout=WITHIN_S + 90)
    assert crashed["state"]["type"] == "CRASHED", crashed["state"]
    assert "heartbeat" in (crashed["state"].get("message") or ""), crashed["state"]

    up(s, ["worker"], timeout=180)  # a new worker (another node)
    second = _wait_state(api, start(0)["id"], FINAL, timeout=240)
    assert second["state"]["type"] == "COMPLETED", worker_log.read_text()[-3000:]
    assert len((run_dir / "prepare.log").read_text().split()) == 1  # from the cache
    assert len((run_dir / "work.log").read_text().split()) == 2  # the unfinished stage again
