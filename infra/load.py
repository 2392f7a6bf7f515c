"""Load test of the scale-out servers (#27): N flow runs of a deployment submitted at once, as N
users pressing Run in the Prefect UI, then drained.

    python infra/load.py --runs 20 [--steps 2] [--deployment train/train] [--json]

Starts its own servers (``infra/services.py up``: Prefect server + process worker + MLflow +
S3 on free ports in a temporary ``VFM_INFRA_DIR``), deploys ``deployments/prefect.yaml``,
submits the runs through the REST API the UI uses, waits until every run has ended, and
reports: time to submit, time to drain, states, each run's own directory and MLflow run, and
the error lines of the servers' logs (sqlite lock contention that the client retried, and the
events a client dropped while the store was locked, are counted apart: they are not failures).
:func:`submit_and_drain` is what the CI test calls with fewer runs.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
FINAL = ("COMPLETED", "FAILED", "CRASHED", "CANCELLED")
_STAMP = re.compile(r"^(\d{2}:\d{2}:\d{2}\.\d+ \||\[?\d{4}-\d{2}-\d{2}[ T]\d{2}:\d{2})")
"""The start of a log entry: Prefect's ``HH:MM:SS.mmm |`` or a dated line (MLflow, uvicorn)."""
LOGS = ("prefect", "worker", "mlflow")
DROPPED_EVENT = "Service 'EventsWorker' failed to process item"
"""How Prefect's client logs an event (heartbeat, state change) the server did not take."""


@dataclass(kw_only=True)
class LoadReport:
    runs: int
    submit_s: float
    """Seconds to create every flow run (server answers, 503 retries included)."""
    drain_s: float
    """Seconds from the first submission until the last run ended."""
    states: dict[str, int]
    run_dirs: list[str]
    flow_run_ids: list[str]
    busy_retries: int
    """Create requests the busy server answered 503 (retried, as the UI's button does)."""
    log_errors: dict[str, list[str]] = field(default_factory=dict)
    """Service -> error lines of its log (sqlite lock contention left out, counted below)."""
    locked: dict[str, int] = field(default_factory=dict)
    """Service -> 'database is locked' lines (retried by the client)."""
    dropped_events: dict[str, int] = field(default_factory=dict)
    """Service -> events its Prefect client could not hand to the server while the server's store
    was locked (``EventsWorker`` logs and drops them: a flow-run heartbeat, the next one sent
    30 s later); counted apart only when the server logged lock contention in the same load."""
    poll_timeouts: int = 0
    """State polls the busy server did not answer within 60 s (polled again, as a browser does)."""


AUTH_VAR = "PREFECT_API_AUTH_STRING"
CHANGES = ("POST", "PATCH", "PUT", "DELETE")
"""Methods Prefect's CSRF protection guards (``PREFECT_SERVER_API_CSRF_PROTECTION_ENABLED``)."""
_CSRF_CLIENT = str(uuid.uuid4())
_csrf: dict[tuple[str, str], tuple[str, float] | None] = {}
"""(API base URL, auth string) -> (CSRF token, monotonic expiry), None where CSRF is off."""


def api(
    method: str,
    url: str,
    body: dict | None = None,
    timeout: float = 60,
    *,
    auth: str | None = None,
) -> tuple[int, dict]:
    """(status, JSON body) of one REST call to a Prefect server (what the UI sends). ``auth``:
    the server's auth string (default ``$PREFECT_API_AUTH_STRING``), sent as HTTP basic auth;
    a call that changes something carries a CSRF token of this client, fetched once per server
    (again when the server no longer knows it); where the token cannot be had, the answer to
    that request is the call's (401 without the secret, 503 from a busy server)."""
    auth = os.environ.get(AUTH_VAR, "") if auth is None else auth
    change = method.upper() in CHANGES
    for fresh in (False, True) if change else (False,):
        headers = {"Content-Type": "application/json", **_basic(auth)}
        if change:
            csrf = _csrf_headers(url, auth, timeout, fresh=fresh)
            if isinstance(csrf, tuple):
                return csrf
            headers.update(csrf)
        code, out = _call(method, url, body, headers, timeout)
        if not (code == 403 and "csrf" in json.dumps(out).lower()):
            break
    return code, out


def _call(
    method: str, url: str, body: dict | None, headers: dict[str, str], timeout: float
) -> tuple[int, dict]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read() or b"{}")
    except urllib.error.HTTPError as e:
        raw = e.read() or b"{}"
        try:
            return e.code, json.loads(raw)
        except ValueError:  # a plain-text refusal (a wrong Host header: 400)
            return e.code, {"detail": raw.decode(errors="replace")}


def _basic(auth: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(auth.encode()).decode()} if auth else {}


def _csrf_headers(
    url: str, auth: str, timeout: float, *, fresh: bool
) -> dict[str, str] | tuple[int, dict]:
    """``Prefect-Csrf-Token`` / ``Prefect-Csrf-Client`` for a change to the API of ``url`` ({}
    where the server's CSRF protection is off), or (status, body) of the token request that
    failed."""
    parts = urllib.parse.urlsplit(url)
    path = parts.path.split("/api/", 1)[0] + "/api" if "/api/" in parts.path else "/api"
    base = f"{parts.scheme}://{parts.netloc}{path}"
    key = (base, auth)
    held = _csrf.get(key, ("", 0.0))
    if fresh or (held is not None and held[1] < time.monotonic()):
        token_url = f"{base}/csrf-token?client={_CSRF_CLIENT}"
        code, token = _call("GET", token_url, None, _basic(auth), timeout)
        if code == 422 and "disabled" in json.dumps(token):
            held = None  # the server does not ask for CSRF tokens
        elif code != 200:
            return code, token
        else:
            expires = datetime.fromisoformat(token["expiration"].replace("Z", "+00:00"))
            left = (expires - datetime.now(UTC)).total_seconds() - 60
            held = (token["token"], time.monotonic() + left)
        _csrf[key] = held
    if held is None:
        return {}
    return {"Prefect-Csrf-Token": held[0], "Prefect-Csrf-Client": _CSRF_CLIENT}


def create_flow_run(
    api_url: str,
    deployment_id: str,
    body: dict,
    *,
    tries: int = 20,
    wait_s: float = 2.0,
    auth: str | None = None,
) -> tuple[dict, int]:
    """(the new flow run, how many times the server answered 503 first) for one run of a
    deployment. A busy server (its sqlite store locked) answers 503 Service Unavailable; the
    request is sent again after `wait_s`, as Prefect's own client retries 503. Any other failure,
    or 503 `tries` times, raises RuntimeError. ``auth``: as :func:`api`'s."""
    refused = 0
    url = f"{api_url}/deployments/{deployment_id}/create_flow_run"
    while True:
        code, run = api("POST", url, body, auth=auth)
        if code != 503 or refused + 1 >= tries:
            break
        refused += 1
        time.sleep(wait_s)
    if code != 201:
        raise RuntimeError(f"create_flow_run: {code} {run}")
    return run, refused


def log_errors(path: Path, start: int = 0) -> tuple[list[str], int]:
    """(first lines of the error entries, entries about sqlite lock contention) of one service
    log from byte ``start``. An entry is a line with a timestamp and what follows it (its
    traceback); one whose text says "database is locked" is lock contention of the sqlite
    store, which the server retries, counted apart."""
    if not path.exists():
        return [], 0
    with path.open("rb") as f:
        f.seek(start)
        lines = f.read().decode(errors="replace").splitlines()
    entries: list[list[str]] = []
    for line in lines:
        if _STAMP.match(line) or not entries:
            entries.append([line])
        else:
            entries[-1].append(line)
    bad, locked = [], 0
    for entry in entries:
        text = "\n".join(entry)
        if not any(w in text for w in ("ERROR", "Traceback", "Exception")):
            continue
        if "database is locked" in text:
            locked += 1
        else:
            bad.append(entry[0])
    return bad, locked


def submit_and_drain(
    api_url: str,
    deployment: str,
    params: list[dict],
    *,
    infra_dir: Path,
    timeout_s: float = 1800,
) -> LoadReport:
    """Create one flow run of ``deployment`` ("flow/deployment") per parameter dict at once,
    wait until all have ended; the report of :class:`LoadReport`."""
    code, dep = api("GET", f"{api_url}/deployments/name/{deployment}")
    if code != 200:
        raise RuntimeError(f"deployment {deployment}: {code} {dep}")
    logs = {name: infra_dir / f"{name}.log" for name in LOGS}
    start = {name: p.stat().st_size if p.exists() else 0 for name, p in logs.items()}
    t0 = time.monotonic()
    runs, busy = [], 0
    for p in params:
        run, refused = create_flow_run(api_url, dep["id"], p)
        busy += refused
        runs.append(run)
    submit_s = time.monotonic() - t0
    pending = {r["id"]: r for r in runs}
    deadline, timeouts = t0 + timeout_s, 0
    while time.monotonic() < deadline:
        for rid in list(pending):
            try:
                code, r = api("GET", f"{api_url}/flow_runs/{rid}")
            except (TimeoutError, urllib.error.URLError):  # a saturated server: ask again
                timeouts += 1
                continue
            if code == 200 and r["state"]["type"] in FINAL:
                pending.pop(rid)
                runs[[x["id"] for x in runs].index(rid)] = r
        if not pending:
            break
        time.sleep(3)
    drain_s = time.monotonic() - t0
    states: dict[str, int] = {}
    for r in runs:
        key = r["state"]["type"] if r["id"] not in pending else "NOT ENDED"
        states[key] = states.get(key, 0) + 1
    report = LoadReport(
        runs=len(runs),
        submit_s=submit_s,
        drain_s=drain_s,
        states=states,
        run_dirs=[p.get("parameters", {}).get("params", {}).get("out_dir", "") for p in params],
        flow_run_ids=[r["id"] for r in runs],
        busy_retries=busy,
        poll_timeouts=timeouts,
    )
    for name, path in logs.items():  # only what was written during this load
        report.log_errors[name], report.locked[name] = log_errors(path, start[name])
    return contention_apart(report)


def contention_apart(report: LoadReport) -> LoadReport:
    """Where the server's store was locked during the load, the clients' events it could not
    take (:data:`DROPPED_EVENT`) move from ``log_errors`` to ``dropped_events``: consequences of
    the same contention, not failures. Without lock contention they stay errors."""
    if not report.locked.get("prefect"):
        return report
    for name, lines in report.log_errors.items():
        kept = [x for x in lines if DROPPED_EVENT not in x]
        report.dropped_events[name] = len(lines) - len(kept)
        report.log_errors[name] = kept
    return report


def free_port() -> int:
    """A free TCP port on 127.0.0.1."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def deploy(prefect_file: str | Path, env: dict[str, str], *, timeout: float = 600) -> None:
    """``prefect deploy --all`` of ``prefect_file`` (run from the repository root) against the
    server ``env`` names; a failure raises with the tail of its output."""
    argv = [str(BIN / "prefect"), "--no-prompt", "deploy", "--all", "--prefect-file"]
    d = subprocess.run(
        [*argv, str(prefect_file)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if d.returncode != 0:
        raise RuntimeError(f"prefect deploy {prefect_file}: {d.stdout[-3000:]}{d.stderr[-3000:]}")


@contextmanager
def own_servers(prefix: str, *, only: str = "") -> Iterator[tuple[Path, dict[str, str]]]:
    """``infra/services.py up`` on free loopback ports, its state in a new temporary folder:
    yields (that folder, the environment of a client of these servers, read from its
    ``env.sh``) and stops the servers on exit. ``only``: comma list of services (default: all
    but ray). A failed start raises RuntimeError with its output."""
    root = Path(tempfile.mkdtemp(prefix=prefix))
    env = dict(os.environ)
    env.update(
        VFM_PREFECT_PORT=str(free_port()),
        VFM_MLFLOW_PORT=str(free_port()),
        VFM_S3_PORT=str(free_port()),
        VFM_INFRA_DIR=str(root / "infra"),
        VFM_DATA_DIR=str(root / "data"),
        PREFECT_HOME=str(root / "client-prefect"),
    )
    services = [sys.executable, str(ROOT / "infra" / "services.py")]
    up = services + ["up"] + (["--only", only] if only else [])
    p = subprocess.run(up, env=env, capture_output=True, text=True, timeout=600, cwd=ROOT)
    try:
        if p.returncode != 0:
            raise RuntimeError(f"infra/services.py up failed:\n{p.stdout}{p.stderr}")
        client = dict(env)
        for line in (root / "infra" / "env.sh").read_text().splitlines():
            key, _, value = line.removeprefix("export ").partition("=")
            client[key] = value.strip("'")
        yield root, client
    finally:
        subprocess.run(services + ["down"], env=env, capture_output=True, text=True, timeout=120)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--deployment", default="train/train")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    if args.runs < 1 or args.steps < 1:
        ap.error("--runs and --steps must be >= 1")
    try:  # a failed start, deploy or submission: its message, exit 1
        with own_servers("vfm-load-") as (root, env):
            os.environ[AUTH_VAR] = env[AUTH_VAR]  # the REST calls below
            deploy("deployments/prefect.yaml", env)
            params = [
                {
                    "parameters": {
                        "params": {
                            "steps": args.steps,
                            "out_dir": str(root / "runs" / f"load-{i:03d}"),
                            "experiment": "vfm-load",
                        }
                    }
                }
                for i in range(args.runs)
            ]
            report = submit_and_drain(
                env["PREFECT_API_URL"], args.deployment, params, infra_dir=root / "infra"
            )
    except RuntimeError as e:
        print(e, file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(asdict(report)))
        return 0
    print(f"## {report.runs} flow runs of {args.deployment} submitted at once ({args.steps} steps)")
    print(
        "| submit s | drain s | states | 503 retries | poll timeouts | log errors | sqlite locked "
        "| dropped events |"
    )
    print("|---|---|---|---|---|---|---|---|")
    errors = {k: len(v) for k, v in report.log_errors.items()}
    print(
        f"| {report.submit_s:.1f} | {report.drain_s:.1f} | {report.states} | "
        f"{report.busy_retries} | {report.poll_timeouts} | {errors} | {report.locked} | "
        f"{report.dropped_events} |"
    )
    for name, lines in report.log_errors.items():
        for x in lines[:5]:
            print(f"{name}: {x}")
    return 0 if report.states == {"COMPLETED": report.runs} else 1


if __name__ == "__main__":
    sys.exit(main())
