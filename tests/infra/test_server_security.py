"""Issue #46: another local process cannot use the servers of ``make up``. On real servers
(``infra/services.py up``, free loopback ports, a temporary run dir): the attack that ran a shell
command through the worker (create a flow, a deployment on the process pool whose
``job_variables.command`` is ``sh -c ...``, a flow run) is refused without the secret, and with
it the pool's fixed command wins; a foreign ``Host`` (DNS rebinding) is refused; moto's admin API
(``POST /moto-api/reset`` wiped the store) is off, S3 takes only the generated key; the secrets
are the owner's only. Fast: the S3 guard's reading of a request's access key."""

from __future__ import annotations

import base64
import json
import stat
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import pytest

from infra.load import api, create_flow_run
from infra.s3_server import credential

REPO = Path(__file__).resolve().parents[2]
FINAL = ("COMPLETED", "FAILED", "CRASHED", "CANCELLED")


def _raw(method: str, url: str, body: dict | None = None, **headers: str) -> tuple[int, str]:
    """(status, body text) of one request with exactly these headers (no credentials added)."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method, headers=headers)
    req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace")


@pytest.fixture(scope="module")
def servers(make_up):
    """(run dir, client env) of the session's ``make up`` servers (tests/infra/conftest.py); the
    worker polls every 2 s; this process holds no secret (the attacker's calls carry none)."""
    root, env = make_up
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv("PREFECT_API_AUTH_STRING", raising=False)
        yield root / "infra", env


@pytest.mark.slow
def test_secrets_are_the_owners_only(servers):
    run_dir, env = servers
    assert stat.S_IMODE(run_dir.stat().st_mode) == 0o700
    for name in ("secrets.json", "services.json", "env.sh"):
        assert stat.S_IMODE((run_dir / name).stat().st_mode) == 0o600, name
    secrets = json.loads((run_dir / "secrets.json").read_text())
    assert env["PREFECT_API_AUTH_STRING"] == secrets["prefect_auth"]
    assert env["AWS_ACCESS_KEY_ID"] == secrets["s3_access_key_id"] != "testing"


@pytest.mark.slow
def test_the_attack_without_the_secret_is_refused(servers, tmp_path):
    _, env = servers
    url = env["PREFECT_API_URL"]
    auth = env["PREFECT_API_AUTH_STRING"]
    basic = "Basic " + base64.b64encode(auth.encode()).decode()
    wrong = "Basic " + base64.b64encode(b"vfm:guess").decode()
    calls = [  # the three calls of the attack, ids made up: each is refused before any lookup
        ("/flows/", {"name": "attack"}),
        ("/deployments/", {"name": "attack", "flow_id": str(uuid.uuid4())}),
        (f"/deployments/{uuid.uuid4()}/create_flow_run", {}),
    ]
    # no CSRF token to be had without the secret
    client = str(uuid.uuid4())
    assert _raw("GET", f"{url}/csrf-token?client={client}")[0] == 401
    assert _raw("GET", f"{url}/csrf-token?client={client}", Authorization=wrong)[0] == 401
    # without a token: Prefect's CSRF check refuses first (403); with the owner's token but no
    # or a wrong secret, its auth check does (401)
    code, token = _raw("GET", f"{url}/csrf-token?client={client}", Authorization=basic)
    assert code == 200, token
    csrf = {"Prefect-Csrf-Token": json.loads(token)["token"], "Prefect-Csrf-Client": client}
    for path, body in calls:
        assert _raw("POST", url + path, body)[0] == 403, path
        assert api("POST", url + path, body, auth="")[0] == 401, path  # its token request
        assert _raw("POST", url + path, body, **csrf)[0] == 401, path
        assert _raw("POST", url + path, body, Authorization=wrong, **csrf)[0] == 401, path
    assert api("GET", f"{url}/flows/name/attack", auth=auth)[0] == 404  # nothing was created
    # reading is refused too; the health check stays open (make up / make status use it)
    assert _raw("POST", f"{url}/flow_runs/filter", {})[0] in (401, 403)
    assert _raw("GET", f"{url}/work_pools/vfm-cpu")[0] == 401
    assert _raw("GET", f"{url}/health")[0] == 200


@pytest.mark.slow
def test_with_the_secret_a_deployments_command_is_not_run(servers, tmp_path):
    """The pool's base job template fixes the command: the flow runs, the shell command never."""
    _, env = servers
    url, auth = env["PREFECT_API_URL"], env["PREFECT_API_AUTH_STRING"]
    pwned = tmp_path / "pwned"
    code, flow = api("POST", f"{url}/flows/", {"name": "schedule-tick"}, auth=auth)
    assert code in (200, 201), flow
    deployment = {
        "name": "attack",
        "flow_id": flow["id"],
        "work_pool_name": "vfm-cpu",
        "entrypoint": "tests/infra/schedule_flow.py:tick",
        "pull_steps": [
            {"prefect.deployments.steps.set_working_directory": {"directory": str(REPO)}}
        ],
        "job_variables": {"command": f"sh -c 'id > {pwned}'"},
    }
    code, dep = api("POST", f"{url}/deployments/", deployment, auth=auth)
    assert code in (200, 201), dep
    code, pool = api("GET", f"{url}/work_pools/vfm-cpu", auth=auth)
    assert code == 200 and "command" not in pool["base_job_template"]["job_configuration"], pool
    runs = []
    for job_variables in ({}, {"command": f"sh -c 'id > {pwned}-run'"}):  # the run's own too
        body = {"job_variables": job_variables}  # a 503 of a busy server: sent again
        runs.append(create_flow_run(url, dep["id"], body, auth=auth)[0])
    deadline = time.monotonic() + 120
    states = {}
    while len(states) < len(runs) and time.monotonic() < deadline:
        for run in runs:
            state = api("GET", f"{url}/flow_runs/{run['id']}", auth=auth)[1]["state"]["type"]
            if state in FINAL:
                states[run["id"]] = state
        time.sleep(2)
    worker_log = (Path(env["VFM_INFRA_DIR"]) / "worker.log").read_text(errors="replace")
    assert list(states.values()) == ["COMPLETED", "COMPLETED"], (states, worker_log[-3000:])
    assert not pwned.exists() and not Path(f"{pwned}-run").exists()


@pytest.mark.slow
def test_a_foreign_host_is_refused_and_the_ui_asks_for_the_secret(servers):
    _, env = servers
    url = env["PREFECT_API_URL"]
    port = url.split(":")[2].split("/")[0]
    assert _raw("GET", f"{url}/health", Host="evil.example.com")[0] == 400
    assert _raw("GET", f"{url}/health", Host=f"evil.example.com:{port}")[0] == 400
    assert _raw("GET", f"{url}/health", Host=f"localhost:{port}")[0] == 200
    s3 = env["AWS_ENDPOINT_URL"]
    assert _raw("GET", f"{s3}/vfm-health", Host="evil.example.com")[0] == 400
    code, page = _raw("GET", url.removesuffix("/api") + "/")
    assert code == 200 and "<html" in page.lower()
    code, ui = _raw("GET", url.removesuffix("/api") + "/ui-settings")
    assert code == 200 and json.loads(ui)["auth"] == "BASIC" and json.loads(ui)["csrf_enabled"]


@pytest.mark.slow
def test_s3_admin_api_is_off_and_only_the_key_is_taken(servers):
    boto3 = pytest.importorskip("boto3")
    _, env = servers
    endpoint = env["AWS_ENDPOINT_URL"]
    keys = {k: env[k] for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")}
    s3 = boto3.client(
        "s3",
        endpoint_url=endpoint,
        region_name="us-east-1",
        aws_access_key_id=keys["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=keys["AWS_SECRET_ACCESS_KEY"],
    )
    s3.create_bucket(Bucket="vfm-keep")
    s3.put_object(Bucket="vfm-keep", Key="a.txt", Body=b"kept")
    for method, path in [("POST", "/moto-api/reset"), ("GET", "/moto-api/data.json")]:
        assert _raw(method, endpoint + path)[0] == 403, path
    assert _raw("GET", endpoint + "/")[0] == 403  # unsigned
    guess = boto3.client(
        "s3",
        endpoint_url=endpoint,
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )
    with pytest.raises(Exception, match="403|Forbidden"):
        guess.list_buckets()
    assert s3.get_object(Bucket="vfm-keep", Key="a.txt")["Body"].read() == b"kept"


def test_the_s3_guard_reads_the_access_key_of_each_signing():
    v4 = (
        "AWS4-HMAC-SHA256 Credential=KEY1/20260101/us-east-1/s3/aws4_request, "
        "SignedHeaders=host, Signature=ab"
    )
    assert credential({"HTTP_AUTHORIZATION": v4}) == ("KEY1", "s3")
    sqs = v4.replace("/s3/", "/sqs/")
    assert credential({"HTTP_AUTHORIZATION": sqs}) == ("KEY1", "sqs")
    query = "X-Amz-Credential=KEY2%2F20260101%2Fus-east-1%2Fs3%2Faws4_request&X-Amz-Signature=x"
    assert credential({"QUERY_STRING": query}) == ("KEY2", "s3")
    assert credential({"HTTP_AUTHORIZATION": "AWS KEY3:c2ln"}) == ("KEY3", "s3")
    assert credential({"QUERY_STRING": "AWSAccessKeyId=KEY4&Signature=x"}) == ("KEY4", "s3")
    assert credential({}) is None
    assert credential({"HTTP_AUTHORIZATION": "Bearer x"}) is None
