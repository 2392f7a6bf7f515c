"""End to end on real servers: infra up -> prefect deploy -> trigger through the UI's REST API ->
the process worker runs a 2-process tensor-parallel training -> the MLflow server has the run's
MFU -> infra down."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SERVICES = [sys.executable, str(REPO / "infra" / "services.py")]
BIN = Path(sys.executable).parent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _api(method: str, url: str, body: dict | None = None, timeout: float = 30) -> tuple[int, dict]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method)
    req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read() or b"{}")
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    root = tmp_path_factory.mktemp("infra")
    env = dict(os.environ)
    env.update(
        VFM_PREFECT_PORT=str(_free_port()),
        VFM_MLFLOW_PORT=str(_free_port()),
        VFM_S3_PORT=str(_free_port()),
        VFM_INFRA_DIR=str(root / "infra"),
        VFM_DATA_DIR=str(root / "data"),
        VFM_WORK_POOL="vfm-cpu",
    )
    up = subprocess.run(SERVICES + ["up"], env=env, capture_output=True, text=True, timeout=400)
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        client = dict(env)
        for line in (root / "infra" / "env.sh").read_text().splitlines():
            key, _, value = line.removeprefix("export ").partition("=")
            client[key] = value.strip("'")
        client["PREFECT_HOME"] = str(root / "client-prefect")
        yield client
    finally:
        down = subprocess.run(SERVICES + ["down"], env=env, capture_output=True, text=True,
                              timeout=120)
        assert down.returncode == 0, down.stderr


@pytest.mark.slow
def test_deploy_trigger_train_and_mfu_in_mlflow_server(servers, tmp_path):
    env = servers
    deploy = subprocess.run(
        [str(BIN / "prefect"), "--no-prompt", "deploy", "--all",
         "--prefect-file", "deployments/prefect.yaml"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300,
    )
    assert deploy.returncode == 0, deploy.stdout[-3000:] + deploy.stderr[-3000:]
    api = env["PREFECT_API_URL"]

    # what the UI does: look the deployment up, then create a flow run with the form's values
    code, dep = _api("GET", f"{api}/deployments/name/train/train")
    assert code == 200, dep
    assert dep["work_pool_name"] == "vfm-cpu"
    assert "params" in dep["parameter_openapi_schema"]["properties"]

    # a wrong type in the form is rejected by the server against the pydantic schema
    code, err = _api("POST", f"{api}/deployments/{dep['id']}/create_flow_run",
                     {"parameters": {"params": {"steps": "many"}}})
    assert code in (409, 422), err
    assert "steps" in json.dumps(err)

    # the UI's form with a parallel layout: 2 processes, tensor parallel 2 (torchrun, gloo)
    out = tmp_path / "run"
    params = {"params": {"recipe": "dit-tiny", "steps": 3, "out_dir": str(out), "nproc": 2,
                         "tp": 2, "experiment": "vfm-e2e", "overrides": ["data.batch_size=2"]}}
    code, run = _api("POST", f"{api}/deployments/{dep['id']}/create_flow_run",
                     {"parameters": params})
    assert code == 201, run
    deadline = time.monotonic() + 600
    state = run["state"]["type"]
    final = ("COMPLETED", "FAILED", "CRASHED", "CANCELLED")
    while state not in final and time.monotonic() < deadline:
        time.sleep(2)
        state = _api("GET", f"{api}/flow_runs/{run['id']}")[1]["state"]["type"]
    worker_log = Path(env["VFM_INFRA_DIR"]) / "worker.log"
    assert state == "COMPLETED", (state, worker_log.read_text()[-4000:])
    assert [json.loads(x)["step"] for x in (out / "metrics.jsonl").open()] == [1, 2, 3]

    import mlflow

    client = mlflow.MlflowClient(tracking_uri=env["MLFLOW_TRACKING_URI"])
    exp = client.get_experiment_by_name("vfm-e2e")
    assert exp is not None
    (mlrun,) = client.search_runs([exp.experiment_id])
    assert mlrun.info.status == "FINISHED"
    assert mlrun.data.metrics["mfu"] > 0
    assert mlrun.data.params["world_size"] == "2"
    assert len(client.get_metric_history(mlrun.info.run_id, "tokens_per_s")) == 3


def test_status_without_servers_names_make_up(tmp_path):
    env = dict(os.environ, VFM_INFRA_DIR=str(tmp_path / "none"))
    r = subprocess.run(SERVICES + ["status"], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 1
    assert "make up" in r.stdout


def test_require_names_make_up():
    sys.path.insert(0, str(REPO))
    from infra.services import InfraError, require

    with pytest.raises(InfraError, match="make up"):
        require(f"http://127.0.0.1:{_free_port()}/api/health", "the Prefect API")
