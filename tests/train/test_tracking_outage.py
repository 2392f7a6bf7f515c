"""The MLflow tracking server killed mid-training (#27 part 2, a): a real ``mlflow server`` on
127.0.0.1 with a sqlite store in tmp_path, killed (its whole process group, SIGKILL) while a run
logs to it. Training goes on without waiting minutes on MLflow's HTTP retries; every step stays in
``metrics.jsonl``; the metrics reach the server when it is back during the run (buffered, then
sent), or, when the run ended first, ``vfm track backfill RUN_DIR`` sends them, the tags and the
run's end status."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from vfm_core.config import TrackingConfig
from vfm_core.tracking_backlog import BACKLOG_FILE, Backlog

BIN = Path(sys.executable).parent
TINY = ["model.hidden=64", "model.depth=2", "data.batch_size=2", "train.device=cpu"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class MlflowServer:
    """``mlflow server`` on a fixed loopback port over one sqlite store: started, killed and
    started again (the store on disk survives)."""

    def __init__(self, root: Path):
        self.root, self.port = root, _free_port()
        self.uri = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None
        self.starts = 0

    def start(self, timeout: float = 120) -> None:
        self.starts += 1
        log = (self.root / f"mlflow-{self.starts}.log").open("wb")
        self.proc = subprocess.Popen(
            [
                str(BIN / "mlflow"),
                "server",
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--backend-store-uri",
                f"sqlite:///{self.root / 'mlflow.db'}",
                "--artifacts-destination",
                str(self.root / "artifacts"),
                "--workers",
                "1",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"},  # as make up
            start_new_session=True,  # its own group: kill() takes the workers with it
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, (self.root / f"mlflow-{self.starts}.log").read_text()
            try:
                urllib.request.urlopen(f"{self.uri}/health", timeout=2).close()
                return
            except OSError:
                time.sleep(0.3)
        raise AssertionError(f"mlflow server not healthy after {timeout} s")

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)
        self.proc = None


@pytest.fixture
def mlflow_server(tmp_path):
    server = MlflowServer(tmp_path)
    server.start()
    yield server
    server.kill()


def _history(uri: str, run_id: str, key: str) -> dict[int, float]:
    import mlflow

    return {m.step: m.value for m in mlflow.MlflowClient(uri).get_metric_history(run_id, key)}


@pytest.mark.slow
def test_metrics_buffered_while_the_server_is_down_reach_it_when_it_is_back(
    mlflow_server, tmp_path, monkeypatch
):
    from vfm_core.tracking_logger import MLflowLogger

    for k in MLflowLogger.HTTP_LIMITS:
        monkeypatch.delenv(k, raising=False)
    backlog = tmp_path / BACKLOG_FILE
    cfg = TrackingConfig(tracking_uri=mlflow_server.uri, experiment="outage")
    mlf = MLflowLogger(cfg, backlog=backlog, retry_s=0.5)
    for step in (1, 2, 3):
        mlf.log(step, {"loss": 1.0 / step})
    assert _history(mlflow_server.uri, mlf.run_id, "loss") == {1: 1.0, 2: 0.5, 3: 1 / 3}

    mlflow_server.kill()
    t0 = time.monotonic()
    for step in range(4, 40):  # the first call finds the server gone, the others wait for it
        mlf.log(step, {"loss": 1.0 / step})
        time.sleep(0.01)
    assert mlf.offline
    assert time.monotonic() - t0 < 30  # MLflow's own retries (minutes) are bounded

    mlflow_server.start()
    time.sleep(0.6)  # past retry_s: the next step sends everything buffered
    mlf.log(40, {"loss": 1.0 / 40})
    assert not mlf.offline
    mlf.set_tag("vfm.checkpoint", "file:///somewhere")
    mlf.close("FINISHED")
    got = _history(mlflow_server.uri, mlf.run_id, "loss")
    assert got == {s: 1.0 / s for s in range(1, 41)}
    import mlflow

    run = mlflow.MlflowClient(mlflow_server.uri).get_run(mlf.run_id)
    assert run.info.status == "FINISHED"
    assert run.data.tags["vfm.checkpoint"] == "file:///somewhere"
    assert not backlog.exists()


@pytest.mark.slow
def test_vfm_train_survives_a_killed_server_and_backfill_sends_the_rest(mlflow_server, tmp_path):
    import mlflow

    steps = 400
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_HTTP")}
    env.update(
        MLFLOW_TRACKING_URI=mlflow_server.uri,
        OMP_NUM_THREADS="1",
        MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL="1",  # the monitor thread also meets the outage
        VFM_DATA_DIR=str(tmp_path / "data"),
    )
    sets = [
        a for s in [*TINY, "train.log_every=1", "tracking.experiment=outage"] for a in ("--set", s)
    ]
    out = tmp_path / "run"
    train = subprocess.Popen(
        [str(BIN / "vfm"), "train", "--steps", str(steps), "--out", str(out), *sets],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    metrics = out / "metrics.jsonl"
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and train.poll() is None:
        if metrics.exists() and len(metrics.read_text().splitlines()) >= 5:
            break
        time.sleep(0.05)
    mlflow_server.kill()
    at_kill = len(metrics.read_text().splitlines())
    try:
        stdout, stderr = train.communicate(timeout=300)
    finally:
        train.kill()
    assert train.returncode == 0, stderr[-3000:]
    assert at_kill < steps, "training ended before the server was killed: raise the steps"
    assert "does not answer" in stderr and "vfm track backfill" in stderr, stderr[-3000:]
    rows = [json.loads(x) for x in metrics.open()]
    assert [r["step"] for r in rows] == list(range(1, steps + 1))  # every step on disk
    backlog = Backlog.read(out / BACKLOG_FILE)
    assert backlog.status == "FINISHED" and backlog.tracking_uri == mlflow_server.uri
    assert "vfm.checkpoint" in backlog.tags  # set after the end: kept for the backfill
    summary = json.loads((out / "summary.json").read_text())
    assert summary["mlflow_run_id"] == backlog.run_id

    mlflow_server.start()
    client = mlflow.MlflowClient(mlflow_server.uri)
    assert client.get_run(backlog.run_id).info.status == "RUNNING"  # as the outage left it
    done = _backfill(out, env)
    assert done["status"] == "FINISHED" and done["metrics"] > 0
    run = client.get_run(backlog.run_id)
    assert run.info.status == "FINISHED"
    assert run.data.tags["vfm.checkpoint"] == backlog.tags["vfm.checkpoint"]
    assert _history(mlflow_server.uri, backlog.run_id, "loss") == {
        r["step"]: r["loss"] for r in rows
    }
    arts = {a.path for a in client.list_artifacts(backlog.run_id)}
    assert {"config.yaml", "metrics.jsonl"} <= arts
    assert not (out / BACKLOG_FILE).exists()

    assert _backfill(out, env)["metrics"] == 0  # a second backfill finds nothing missing


def _backfill(out, env: dict) -> dict:
    """``vfm track backfill OUT --json`` as a user runs it: its counts."""
    fill = subprocess.run(
        [str(BIN / "vfm"), "track", "backfill", str(out), "--json"],
        cwd=out.parent,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert fill.returncode == 0, fill.stderr[-3000:]
    return json.loads(fill.stdout.strip().splitlines()[-1])


def test_a_resumed_run_sends_the_steps_it_re_runs_once(tmp_path):
    """Resumed from a checkpoint before its last logged step, the run re-runs (bit-identically)
    steps MLflow has: they are not sent again (MLflow would chart two points for each)."""
    import mlflow

    from vfm_core.tracking_logger import MLflowLogger

    uri = f"sqlite:///{tmp_path / 'm.db'}"
    cfg = TrackingConfig(tracking_uri=uri, experiment="resume")
    first = MLflowLogger(cfg)
    for step in range(1, 6):  # a checkpoint at step 3, killed after step 5
        first.log(step, {"loss": 1.0 / step})
    first.close()
    again = MLflowLogger(cfg, run_id=first.run_id)
    for step in range(4, 8):
        again.log(step, {"loss": 1.0 / step})
    again.close()
    steps = [m.step for m in mlflow.MlflowClient(uri).get_metric_history(first.run_id, "loss")]
    assert sorted(steps) == [1, 2, 3, 4, 5, 6, 7]
