"""A flow run as users run it without servers (``python -m flows.X``): no ``PREFECT_API_URL``,
a ``PREFECT_HOME`` that does not exist yet, Prefect's settings untouched
(:func:`vfm_core.infra_env.prefect_without_server`)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.flows.test_shard_flow import curation_output
from vfm_core.data.index import read_index
from vfm_core.infra_env import PREFECT_DEFAULTS, prefect_without_server

REPO = Path(__file__).resolve().parents[2]
TIMEOUT = "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS"


def test_setup_creates_the_folders_and_keeps_what_the_user_set(tmp_path, monkeypatch):
    home = tmp_path / "not" / "yet" / "prefect"
    monkeypatch.setenv("PREFECT_HOME", str(home))
    monkeypatch.delenv(TIMEOUT, raising=False)
    monkeypatch.setenv("PREFECT_SERVER_ANALYTICS_ENABLED", "true")  # the user's: kept
    db = tmp_path / "db" / "dir" / "prefect.db"
    monkeypatch.setenv("PREFECT_SERVER_DATABASE_CONNECTION_URL", f"sqlite+aiosqlite:///{db}")
    assert prefect_without_server() == {TIMEOUT: PREFECT_DEFAULTS[TIMEOUT]}
    assert home.is_dir() and db.parent.is_dir()
    assert os.environ["PREFECT_SERVER_ANALYTICS_ENABLED"] == "true"
    # a setting in the active profile is the user's too
    monkeypatch.delenv(TIMEOUT)
    (home / "profiles.toml").write_text(f'active = "mine"\n[profiles.mine]\n{TIMEOUT} = 300\n')
    assert prefect_without_server() == {}
    assert TIMEOUT not in os.environ


@pytest.mark.slow
def test_a_flow_entry_point_runs_without_a_server_or_prefect_home(tmp_path):
    src = curation_output(tmp_path / "cur", n=2)
    home = tmp_path / "no" / "prefect-home"
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("PREFECT_API_URL", TIMEOUT, "PREFECT_SERVER_ANALYTICS_ENABLED")
    }
    env.update(PREFECT_HOME=str(home), OMP_NUM_THREADS="1")
    r = subprocess.run(
        [sys.executable, "-m", "flows.shard", str(src), str(tmp_path / "shards")],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=400,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert "unable to open database file" not in r.stderr
    assert len(read_index(str(tmp_path / "shards"))) == 2
    assert (home / "prefect.db").is_file()  # the temporary API's database, in PREFECT_HOME


NAPPING_FLOW = """
import time
import flows  # Prefect readied as for python -m flows.X
from prefect import flow, task
from flows.entry import run_main

@task
def nap():
    print("napping", flush=True)
    time.sleep(120)

@flow
def napping():
    nap()

run_main(napping, name="napping flow")
"""


@pytest.mark.parametrize(
    ("sig", "rc", "line"), [("SIGINT", 130, "interrupted"), ("SIGTERM", 143, "terminated")]
)
def test_ctrl_c_or_sigterm_ends_a_flow_with_one_line(tmp_path, sig, rc, line):
    """Ctrl-C (SIGINT) or SIGTERM of a flow started from a terminal (flows.entry.run_main): exit
    130 / 143 and one line on stderr after the start-up lines (SIGTERM: after Prefect's records
    of the crash): no traceback or shutdown noise; the temporary API server it started is
    stopped, not left running."""
    import signal

    script = tmp_path / "napping.py"
    script.write_text(NAPPING_FLOW)
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    env.update(PREFECT_HOME=str(tmp_path / "prefect"), PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    p = subprocess.Popen(
        [sys.executable, str(script)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=tmp_path,
    )
    try:
        assert p.stdout.readline().strip() == "napping"  # inside the task
        children = _children(p.pid)  # the temporary API server among them
        p.send_signal(getattr(signal, sig))
        out, err = p.communicate(timeout=120)
    finally:
        p.kill()
    assert p.returncode == rc, err[-2000:]
    started = err.index("Beginning flow run")
    after = [ln for ln in err[started:].splitlines()[1:] if ln.strip()]
    if sig == "SIGINT":
        assert after == [f"napping flow: {line}"], err[-2000:]
    else:  # Prefect's own SIGTERM handler logs the crash first, then hands over
        assert after[-1] == f"napping flow: {line}", err[-2000:]
        assert all("termination signal" in ln for ln in after[:-1]), err[-2000:]
    assert "Traceback" not in err and out == ""
    assert children, "no child process (the temporary server) seen"
    deadline = time.monotonic() + 30
    while (alive := [c for c in children if _running(c)]) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not alive, f"left running: {alive}"


def _children(pid: int) -> list[int]:
    """Child pids of ``pid`` (Linux /proc)."""
    kids = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        kids += [int(x) for x in (task / "children").read_text().split()]
    return kids


def _running(pid: int) -> bool:
    """Whether ``pid`` is a live process (not gone, not a zombie)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z"
    except (FileNotFoundError, IndexError):
        return False
