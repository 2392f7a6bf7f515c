"""End to end on real servers: infra up -> prefect deploy -> trigger through the UI's REST API ->
the process worker runs a 2-process tensor-parallel training -> the MLflow server has the run's
MFU -> infra down."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from infra.load import api as _api
from infra.load import create_flow_run, deploy
from infra.load import free_port as _free_port

REPO = Path(__file__).resolve().parents[2]
SERVICES = [sys.executable, str(REPO / "infra" / "services.py")]
BIN = Path(sys.executable).parent


@pytest.fixture(scope="module")
def servers(make_up):
    """The client environment of the session's ``make up`` servers (tests/infra/conftest.py),
    its secret also where :func:`infra.load.api` reads it."""
    _, client = make_up
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PREFECT_API_AUTH_STRING", client["PREFECT_API_AUTH_STRING"])
        yield client


@pytest.mark.slow
def test_deploy_trigger_train_and_mfu_in_mlflow_server(servers, tmp_path):
    env = servers
    deploy("deployments/prefect.yaml", env)
    api = env["PREFECT_API_URL"]

    # what the UI does: look the deployment up, then create a flow run with the form's values
    code, dep = _api("GET", f"{api}/deployments/name/train/train")
    assert code == 200, dep
    assert dep["work_pool_name"] == "vfm-cpu"
    assert "params" in dep["parameter_openapi_schema"]["properties"]

    # a wrong type in the form is rejected by the server against the pydantic schema
    code, err = _api(
        "POST",
        f"{api}/deployments/{dep['id']}/create_flow_run",
        {"parameters": {"params": {"steps": "many"}}},
    )
    assert code in (409, 422), err
    assert "steps" in json.dumps(err)

    # the UI's form with a parallel layout: 2 processes, tensor parallel 2 (torchrun, gloo)
    out = tmp_path / "run"
    params = {
        "params": {
            "recipe": "dit-tiny",
            "steps": 3,
            "out_dir": str(out),
            "nproc": 2,
            "tp": 2,
            "experiment": "vfm-e2e",
            "overrides": ["data.batch_size=2"],
        }
    }
    state, _ = run_deployment(env, dep["id"], params)
    assert state == "COMPLETED", (state, _worker_log(env))
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


def _worker_log(env: dict) -> str:
    return (Path(env["VFM_INFRA_DIR"]) / "worker.log").read_text()[-4000:]


def run_deployment(env: dict, dep_id: str, params: dict | None) -> tuple[str, dict]:
    """What the UI's Run button does; waits for the flow run to end: (state type, flow run)."""
    api = env["PREFECT_API_URL"]
    body = {} if params is None else {"parameters": params}
    # a busy server's SQLite timeout answers 503: sent again, as the UI's button is pressed again
    run = create_flow_run(api, dep_id, body, tries=10, wait_s=3)[0]
    deadline = time.monotonic() + 600
    final = ("COMPLETED", "FAILED", "CRASHED", "CANCELLED")
    while run["state"]["type"] not in final and time.monotonic() < deadline:
        time.sleep(2)
        run = _api("GET", f"{api}/flow_runs/{run['id']}")[1]
    return run["state"]["type"], run


@pytest.mark.slow
def test_a_failing_train_run_ends_its_mlflow_run_failed(servers):
    """A run failing after its MLflow run was created: Prefect FAILED, MLflow FAILED with the
    error as tag vfm.error. (Runs of the deployment's defaults: the load test below.)"""
    import mlflow

    env = servers
    dep = _train_deployment(env)
    bad = {
        "params": {
            "steps": 2,
            "overrides": ["data.source=shards", "data.shards=/nonexistent/shards"],
        }
    }
    state, run = run_deployment(env, dep["id"], bad)
    assert state == "FAILED", _worker_log(env)
    client = mlflow.MlflowClient(tracking_uri=env["MLFLOW_TRACKING_URI"])
    exp = client.get_experiment_by_name("vfm")
    (ml,) = client.search_runs(
        [exp.experiment_id], f"tags.`vfm.prefect_flow_run_id` = '{run['id']}'"
    )
    assert ml.info.status == "FAILED"
    assert "/nonexistent/shards" in ml.data.tags["vfm.error"]


def _train_deployment(env: dict) -> dict:
    """The train deployment of deployments/prefect.yaml (deployed here when a test runs alone)."""
    url = f"{env['PREFECT_API_URL']}/deployments/name/train/train"
    code, dep = _api("GET", url)
    if code == 404:
        deploy("deployments/prefect.yaml", env)
        code, dep = _api("GET", url)
    assert code == 200, dep
    return dep


@pytest.mark.slow
def test_one_store_when_servers_run(servers, tmp_path):
    """With the servers of `make up` running, `vfm train` in a plain shell (no env.sh sourced)
    logs to the MLflow server, and `make status` finds the ports `make up` chose. The MLflow
    server keeps its own host check (a DNS-rebinding page is refused)."""
    import urllib.error
    import urllib.request

    import mlflow

    search = f"{servers['MLFLOW_TRACKING_URI']}/api/2.0/mlflow/experiments/search?max_results=1"
    req = urllib.request.Request(search, headers={"Host": "evil.example.com"})  # not /health
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(req, timeout=60)
    assert refused.value.code == 403

    from vfm_core.infra_env import SERVICE_VARS

    sourced = {var for names in SERVICE_VARS.values() for var in names}
    plain = {
        k: v
        for k, v in servers.items()
        if k not in sourced and not (k.startswith("VFM_") and k.endswith("_PORT"))
    }
    st = subprocess.run(
        SERVICES + ["status"], env=plain, capture_output=True, text=True, timeout=60
    )
    assert st.returncode == 0, st.stdout + st.stderr
    assert servers["MLFLOW_TRACKING_URI"] in st.stdout  # the chosen port, not 5000

    r = subprocess.run(
        [
            str(BIN / "vfm"),
            "train",
            "--recipe",
            "dit-tiny",
            "--steps",
            "2",
            "--out",
            str(tmp_path / "cli"),
            "--set",
            "data.batch_size=2",
            "--set",
            "tracking.experiment=vfm-one-store",
        ],
        env=plain,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    client = mlflow.MlflowClient(tracking_uri=servers["MLFLOW_TRACKING_URI"])
    exp = client.get_experiment_by_name("vfm-one-store")
    assert exp is not None, "the CLI's run did not reach the MLflow server of `make up`"
    (ml,) = client.search_runs([exp.experiment_id])
    assert ml.info.status == "FINISHED" and ml.data.metrics["loss"] > 0
    assert not (Path(plain["VFM_DATA_DIR"]) / "mlflow" / "mlflow.db").exists()


def test_status_without_servers_names_make_up(tmp_path):
    env = dict(os.environ, VFM_INFRA_DIR=str(tmp_path / "none"))
    r = subprocess.run(SERVICES + ["status"], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 1
    assert "make up" in r.stdout


def test_require_names_make_up():
    from infra.services import InfraError, require

    with pytest.raises(InfraError, match="make up"):
        require(f"http://127.0.0.1:{_free_port()}/api/health", "the Prefect API")


@pytest.mark.slow
def test_flow_runs_submitted_at_once_all_complete_with_their_own_runs(servers, tmp_path):
    """The load test (#27 part 3) at CI size: flow runs of the train deployment submitted at once
    (``python infra/load.py --runs 20`` is the full one) all complete, each with its own run
    directory and MLflow run, and the servers log no error while they drain. Two of them (at CI
    size, the only two: each flow run is a process start, issue #45's CI time) are the
    deployment's defaults (what the UI's Run button sends): repeatable, each flow run in its own
    directory under the data dir, its MLflow run named and linked to the flow run;
    ``VFM_LOAD_RUNS=N`` adds N - 2 short runs of their own."""
    import mlflow

    from infra.load import submit_and_drain

    env = servers
    api = env["PREFECT_API_URL"]
    _train_deployment(env)
    n = max(2, int(os.environ.get("VFM_LOAD_RUNS", "2")))
    small = [
        {
            "parameters": {
                "params": {
                    "steps": 2,
                    "out_dir": str(tmp_path / f"load-{i}"),
                    "experiment": "vfm-load",
                }
            }
        }
        for i in range(n - 2)
    ]
    infra_dir = Path(env["VFM_INFRA_DIR"])
    report = submit_and_drain(api, "train/train", [{}, {}, *small], infra_dir=infra_dir)
    print(f"load: {n} runs, submit {report.submit_s:.1f} s, drain {report.drain_s:.1f} s")
    assert report.states == {"COMPLETED": n}, (report, _worker_log(env))
    client = mlflow.MlflowClient(tracking_uri=env["MLFLOW_TRACKING_URI"])
    if small:
        for i in range(n - 2):
            assert len((tmp_path / f"load-{i}" / "metrics.jsonl").read_text().splitlines()) == 2
        found = client.search_runs([client.get_experiment_by_name("vfm-load").experiment_id])
        ids = {r.data.tags["vfm.prefect_flow_run_id"] for r in found}
        assert ids == set(report.flow_run_ids[2:])
        assert all(r.info.status == "FINISHED" for r in found)

    defaults = report.flow_run_ids[:2]
    names = [_api("GET", f"{api}/flow_runs/{rid}")[1]["name"] for rid in defaults]
    for name in names:  # each its own directory: the flow run's name under the data dir
        metrics = Path(env["VFM_DATA_DIR"]) / "runs" / "dit-tiny" / name / "metrics.jsonl"
        assert len(metrics.read_text().splitlines()) == 20
    exp = client.get_experiment_by_name("vfm")
    for rid in defaults:
        (ml,) = client.search_runs([exp.experiment_id], f"tags.`vfm.prefect_flow_run_id` = '{rid}'")
        assert ml.info.status == "FINISHED" and ml.info.run_name == "dit-tiny 1proc 20 steps"
        assert ml.data.tags["vfm.prefect_flow_run_url"].endswith(f"/runs/flow-run/{rid}")
    if any(report.log_errors.values()):  # the whole log, to see what a traceback was about
        print((infra_dir / "prefect.log").read_text(errors="replace")[-20000:])
    assert report.log_errors == {"prefect": [], "worker": [], "mlflow": []}, report.log_errors
