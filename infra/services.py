"""Start, check and stop the scale-out servers on loopback (``make up`` / ``make down``).

    python infra/services.py up [--with-ray] [--only prefect,worker,mlflow,s3]
    python infra/services.py status
    python infra/services.py down

Services (each binds ``$VFM_HOST``, default 127.0.0.1; ports overridable by environment):

| service | what                                               | port (env)                  |
|---------|----------------------------------------------------|-----------------------------|
| prefect | Prefect's server (API + UI), ``prefect_server.py`` | 4200 (``VFM_PREFECT_PORT``) |
| worker  | ``prefect worker start`` on the process pool       | —                           |
| mlflow  | ``mlflow server``, sqlite store, served artifacts  | 5000 (``VFM_MLFLOW_PORT``)  |
| s3      | moto's S3 server (local S3), ``s3_server.py``      | 9000 (``VFM_S3_PORT``)      |
| ray     | ``ray start --head`` (optional, ``--with-ray``)    | 6379 (``VFM_RAY_PORT``)     |

State lives in ``$VFM_INFRA_DIR`` (default ``data/infra``): one log per service, ``services.json``
(pids, ports, health URLs, client settings: ``vfm``, ``make demo`` and ``make status`` read it) and
``env.sh`` — ``source data/infra/env.sh`` points a shell (Prefect, MLflow, s3fs clients) at them.
Production swaps the sqlite store for a Postgres URI (``VFM_MLFLOW_BACKEND``) and moto for real S3.

Another local user cannot use them (issue #46): the run dir is 0700, ``services.json``, ``env.sh``
and ``secrets.json`` (:mod:`infra.server_secrets`) 0600; the Prefect API asks for the basic-auth
string of ``secrets.json`` and a CSRF token; the Prefect and S3 servers refuse a ``Host`` that is
not loopback (DNS rebinding); the work pools fix the command a flow run starts (a deployment's
``job_variables.command`` is ignored); the S3 endpoint has no admin API and takes only requests
signed with the generated access key id.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere
from infra.load import api  # noqa: E402
from infra.server_secrets import (  # noqa: E402
    SecretsError,
    ServerSecrets,
    private_dir,
    server_secrets,
    write_private,
)
from vfm_core.infra_env import (  # noqa: E402
    EXTRA_LOGGERS,
    LIBRARY_LOGGER,
    extra_loggers_with,
    healthy,
    pid_alive,
    read_services,
    services_file,
)

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
SERVICES = ("prefect", "worker", "mlflow", "s3", "ray")
POOL = "vfm-cpu"
GPU_POOL = "vfm-gpu"


GIB_PER_RUN = 3
"""Memory to budget per concurrent flow run: its flow process and its trainer hold ~1.2 GiB on
CPU (measured: 20 runs at once on a 24 GiB machine had 5 killed by the kernel's OOM killer)."""


def default_worker_limit() -> int:
    """Concurrent flow runs this machine can hold: one per core, at most one per
    :data:`GIB_PER_RUN` GiB of memory (``VFM_WORKER_LIMIT`` overrides it)."""
    import psutil

    by_memory = int(psutil.virtual_memory().total / 2**30 // GIB_PER_RUN)
    return max(1, min(os.cpu_count() or 1, by_memory))


class InfraError(RuntimeError):
    """A service that cannot start or is not running, with what to do about it."""


@dataclass(kw_only=True, slots=True)
class Settings:
    host: str = "127.0.0.1"
    """Address every server binds (loopback unless told otherwise)."""
    prefect_port: int = 4200
    mlflow_port: int = 5000
    s3_port: int = 9000
    ray_port: int = 6379
    run_dir: Path = field(default_factory=lambda: ROOT / "data" / "infra")
    """Logs, services.json, env.sh, the server stores."""
    mlflow_backend: str = ""
    """MLflow backend store URI ('' = sqlite under run_dir; a Postgres URI in production)."""
    pool: str = POOL
    """Prefect work pool served by the worker."""
    worker_limit: int = 0
    """Flow runs the worker runs at once (0 = :func:`default_worker_limit`); the rest wait in
    the pool's queue instead of exhausting the machine."""

    @classmethod
    def from_env(cls) -> Settings:
        env = os.environ
        data = Path(env.get("VFM_DATA_DIR", ROOT / "data"))
        return cls(
            host=env.get("VFM_HOST", "127.0.0.1"),
            prefect_port=int(env.get("VFM_PREFECT_PORT", 4200)),
            mlflow_port=int(env.get("VFM_MLFLOW_PORT", 5000)),
            s3_port=int(env.get("VFM_S3_PORT", 9000)),
            ray_port=int(env.get("VFM_RAY_PORT", 6379)),
            run_dir=Path(env.get("VFM_INFRA_DIR", data / "infra")).resolve(),
            mlflow_backend=env.get("VFM_MLFLOW_BACKEND", ""),
            pool=env.get("VFM_WORK_POOL", POOL),
            worker_limit=int(env.get("VFM_WORKER_LIMIT", 0)),
        )

    @property
    def prefect_api(self) -> str:
        return f"http://{self.host}:{self.prefect_port}/api"

    @property
    def mlflow_uri(self) -> str:
        return f"http://{self.host}:{self.mlflow_port}"

    @property
    def s3_endpoint(self) -> str:
        return f"http://{self.host}:{self.s3_port}"

    def secrets(self) -> ServerSecrets:
        """The servers' secrets (``run_dir/secrets.json``, 0600; generated the first time)."""
        return server_secrets(self.run_dir)

    def client_env(self) -> dict[str, str]:
        """What a client (or the worker's flow runs) needs to talk to these servers: addresses
        and credentials (secrets: write it only to files of mode 0600)."""
        secrets = self.secrets()
        return {
            "PREFECT_API_URL": self.prefect_api,
            "PREFECT_API_AUTH_STRING": secrets.prefect_auth,
            "MLFLOW_TRACKING_URI": self.mlflow_uri,
            "AWS_ENDPOINT_URL": self.s3_endpoint,
            "AWS_ACCESS_KEY_ID": secrets.s3_access_key_id,
            "AWS_SECRET_ACCESS_KEY": secrets.s3_secret_access_key,
            "AWS_DEFAULT_REGION": os.environ.get("AWS_DEFAULT_REGION", "us-east-1"),
            "VFM_ROOT": str(ROOT),
        }

    def server_env(self, name: str) -> dict[str, str]:
        """What the server ``name`` alone is started with (its side of the secrets)."""
        secrets = self.secrets()
        if name == "prefect":
            return {
                "PREFECT_SERVER_API_AUTH_STRING": secrets.prefect_auth,
                "PREFECT_SERVER_API_CSRF_PROTECTION_ENABLED": "true",
            }
        if name == "s3":
            return {"VFM_S3_ACCESS_KEY_ID": secrets.s3_access_key_id}
        if name == "mlflow":  # no GenAI job runners: 7 huey consumer processes vfm never uses
            return {"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
        return {}


def _port_free(host: str, port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def _commands(s: Settings) -> dict[str, tuple[list[str], str | None, int | None]]:
    """service -> (argv, health URL or None, port or None)."""
    store = s.mlflow_backend or f"sqlite:///{s.run_dir / 'mlflow' / 'mlflow.db'}"
    prefect = [str(BIN / "prefect")]
    here = [sys.executable, "-u"]
    return {
        "prefect": (
            here
            + [str(ROOT / "infra" / "prefect_server.py")]
            + ["--host", s.host, "--port", str(s.prefect_port)],
            f"{s.prefect_api}/health",
            s.prefect_port,
        ),
        "worker": (
            prefect
            + ["worker", "start", "--pool", s.pool, "--type", "process"]
            + ["--limit", str(s.worker_limit or default_worker_limit())],
            None,
            None,
        ),
        "mlflow": (
            [
                str(BIN / "mlflow"),
                "server",
                "--host",
                s.host,
                "--port",
                str(s.mlflow_port),
                "--backend-store-uri",
                store,
                "--artifacts-destination",
                str(s.run_dir / "mlflow" / "artifacts"),
                "--workers",
                "1",
            ],
            f"{s.mlflow_uri}/health",
            s.mlflow_port,
        ),
        "s3": (
            here
            + [str(ROOT / "infra" / "s3_server.py"), "--host", s.host]
            + ["--port", str(s.s3_port)],
            f"{s.s3_endpoint}/vfm-health",
            s.s3_port,
        ),
        "ray": (
            [
                str(BIN / "ray"),
                "start",
                "--head",
                "--block",
                "--node-ip-address",
                s.host,
                "--port",
                str(s.ray_port),
                "--num-cpus",
                str(os.cpu_count() or 1),
                "--include-dashboard",
                "false",
                "--disable-usage-stats",
            ],
            None,
            s.ray_port,
        ),
    }


def pool_job_template() -> dict:
    """The process worker's default base job template without ``command`` (neither in the job
    configuration nor among the variables a deployment or flow run may set): every flow run
    starts the worker's own engine command, and a deployment's ``job_variables.command`` (``sh
    -c ...``) is ignored instead of run by the worker."""
    from prefect.workers.process import ProcessWorker

    template = ProcessWorker.get_default_base_job_template()
    template["job_configuration"].pop("command", None)
    template["variables"]["properties"].pop("command", None)
    template["variables"]["required"] = [
        x for x in template["variables"].get("required", []) if x != "command"
    ]
    return template


def _create_pools(s: Settings) -> None:
    """The CPU pool this worker serves, and the GPU pool that cluster workers serve (deployments
    naming it register here; their runs wait for a GPU worker); both with
    :func:`pool_job_template` (``prefect work-pool create --overwrite``, through the REST API the
    CLI calls: no CLI start per pool)."""
    template = pool_job_template()
    (s.run_dir / "pool-template.json").write_text(json.dumps(template, indent=1))
    auth = s.secrets().prefect_auth
    for pool in (s.pool, GPU_POOL):
        body = {"name": pool, "type": "process", "base_job_template": template}
        code, out = api("POST", f"{s.prefect_api}/work_pools/", body, auth=auth)
        if code == 409:  # it exists: its template is ours again
            update = {"base_job_template": template}
            code, out = api("PATCH", f"{s.prefect_api}/work_pools/{pool}", update, auth=auth)
        if code >= 300:
            raise InfraError(f"cannot create work pool {pool}: {code} {str(out)[-500:]}")


ZOMBIE_AUTOMATION = "vfm-crash-silent-flow-runs"
HEARTBEAT_S = 30
"""Seconds between a flow run's heartbeats (``PREFECT_FLOWS_HEARTBEAT_FREQUENCY``; Prefect
3.8.8's minimum is 30)."""


def crash_silent_flow_runs(
    api_url: str, *, within_s: int = 3 * HEARTBEAT_S, auth: str | None = None
) -> str:
    """Create (once) the server automation that marks a flow run CRASHED when its heartbeats
    stop for ``within_s`` seconds without it ending: a worker or node that died with the run.
    Prefect 3.8.8's server has no other zombie detection (its foreman only marks workers
    offline; the runs stay RUNNING forever). Flow runs send heartbeats only with
    ``PREFECT_FLOWS_HEARTBEAT_FREQUENCY`` set (the worker's environment). ``auth``: the API's
    auth string (default ``$PREFECT_API_AUTH_STRING``). Returns its id."""
    from datetime import timedelta

    from prefect.client.schemas.objects import StateType
    from prefect.events.actions import ChangeFlowRunState
    from prefect.events.schemas.automations import AutomationCore, EventTrigger, Posture

    def call(method: str, url: str, body: dict | None = None) -> object:
        code, out = api(method, url, body, auth=auth)
        if code >= 300:
            raise InfraError(f"{method} {url}: {code} {out}")
        return out

    found = call("POST", f"{api_url}/automations/filter", {"limit": 200})
    for a in found if isinstance(found, list) else []:
        if a.get("name") == ZOMBIE_AUTOMATION:
            return a["id"]
    ended = ("Completed", "Failed", "Cancelled", "Crashed")
    automation = AutomationCore(
        name=ZOMBIE_AUTOMATION,
        description="A flow run whose heartbeats stopped (its worker or node died) is CRASHED.",
        trigger=EventTrigger(
            after={"prefect.flow-run.heartbeat"},
            expect={"prefect.flow-run.heartbeat", *(f"prefect.flow-run.{x}" for x in ended)},
            match={"prefect.resource.id": ["prefect.flow-run.*"]},
            for_each={"prefect.resource.id"},
            posture=Posture.Proactive,
            threshold=1,
            within=timedelta(seconds=within_s),
        ),
        actions=[
            ChangeFlowRunState(
                state=StateType.CRASHED,
                message=f"no heartbeat for {within_s} s: its worker or node died",
            )
        ],
    )
    return call("POST", f"{api_url}/automations/", automation.model_dump(mode="json"))["id"]


def _env(s: Settings) -> dict[str, str]:
    env = dict(os.environ)
    env.update(s.client_env())
    env["PREFECT_HOME"] = str(s.run_dir / "prefect-home")
    env["PREFECT_SERVER_ANALYTICS_ENABLED"] = "false"
    env["RAY_USAGE_STATS_ENABLED"] = "0"  # nothing leaves the machine
    env["PREFECT_UI_API_URL"] = s.prefect_api
    # flow runs send heartbeats: the automation of crash_silent_flow_runs sees a dead worker
    env.setdefault("PREFECT_FLOWS_HEARTBEAT_FREQUENCY", str(HEARTBEAT_S))
    # the worker's flow runs send the library's log lines (progress) to the run log
    env[EXTRA_LOGGERS] = extra_loggers_with(LIBRARY_LOGGER, env.get(EXTRA_LOGGERS, ""))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env.setdefault("VFM_DATA_DIR", str(ROOT / "data"))
    env.setdefault("HF_HUB_OFFLINE", "1")
    return env


def _record_path(s: Settings) -> Path:
    return services_file(s.run_dir)


def _read_pids(s: Settings) -> dict[str, int]:
    return {k: int(v["pid"]) for k, v in read_services(s.run_dir).get("services", {}).items()}


def _write_record(s: Settings, services: dict[str, dict]) -> None:
    """``services.json``: what runs (pid, port, health URL) and the client settings; clients
    (``vfm``, ``make demo``, ``make status``) read it instead of assuming the default ports."""
    record = {"host": s.host, "services": services, "env": s.client_env()}
    write_private(_record_path(s), json.dumps(record, indent=1))


def _wait(url: str | None, proc: subprocess.Popen, name: str, log: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            tail = log.read_text(errors="replace")[-2000:]
            raise InfraError(f"{name} exited with code {proc.returncode}; log {log}:\n{tail}")
        if url is None or healthy(url):
            return
        time.sleep(0.5)
    raise InfraError(f"{name} not healthy after {timeout:.0f}s ({url}); log {log}")


def up(s: Settings, services: list[str], *, timeout: float = 120.0) -> dict[str, int]:
    """Start ``services`` (skipping those already running), wait until each is healthy, write
    ``env.sh``; returns service -> pid."""
    try:
        private_dir(s.run_dir)
        s.secrets()
    except SecretsError as e:
        raise InfraError(str(e)) from e
    (s.run_dir / "mlflow").mkdir(exist_ok=True)
    known = read_services(s.run_dir).get("services", {})
    running = {k: v for k, v in known.items() if pid_alive(int(v["pid"]))}
    pids = {k: int(v["pid"]) for k, v in running.items()}
    for name, info in running.items():  # a running server keeps its port: clients follow it
        if info.get("port") and hasattr(s, f"{name}_port"):
            setattr(s, f"{name}_port", int(info["port"]))
    cmds, env = _commands(s), _env(s)
    # the servers start together (each migrates its own database), the worker once Prefect is up
    waves = [[n for n in services if n != "worker"], [n for n in services if n == "worker"]]
    for wave in waves:
        started = []
        for name in wave:
            if name in pids:
                print(f"{name}: already running (pid {pids[name]})")
                continue
            argv, health, port = cmds[name]
            if port is not None and not _port_free(s.host, port):
                var = f"VFM_{name.upper()}_PORT"
                raise InfraError(f"{name}: port {s.host}:{port} is taken; set {var} to another")
            if name == "worker":
                _create_pools(s)
                try:  # a run whose worker dies is CRASHED, not RUNNING forever (heartbeats stop)
                    crash_silent_flow_runs(s.prefect_api, auth=s.secrets().prefect_auth)
                except Exception as e:  # the server without automations: say so, keep going
                    print(f"worker: no crash detection for silent flow runs ({e})")
            log = s.run_dir / f"{name}.log"
            with log.open("ab") as f:
                proc = subprocess.Popen(
                    argv,
                    stdout=f,
                    stderr=subprocess.STDOUT,
                    env={**env, **s.server_env(name)},
                    cwd=ROOT,
                    start_new_session=True,
                )
            pids[name] = proc.pid
            running[name] = {"pid": proc.pid, "port": port, "health": health}
            _write_record(s, running)
            started.append((name, proc, health, log))
        for name, proc, health, log in started:
            _wait(health, proc, name, log, timeout)
            print(f"{name}: up (pid {proc.pid}){f' at {health}' if health else ''}, log {log}")
    _write_record(s, running)
    env = read_services(s.run_dir)["env"]  # the settings of the servers already up win
    lines = [f"export {k}={shlex.quote(v)}" for k, v in env.items()]
    write_private(s.run_dir / "env.sh", "\n".join(lines) + "\n")
    return pids


def down(s: Settings, *, timeout: float = 20.0) -> list[str]:
    """Stop every service started by :func:`up` (SIGTERM to its process group, then SIGKILL)."""
    pids = _read_pids(s)
    for pid in reversed(list(pids.values())):
        try:
            os.killpg(pid, signal.SIGTERM)
        except OSError:
            continue
    deadline = time.monotonic() + timeout
    while any(pid_alive(p) for p in pids.values()) and time.monotonic() < deadline:
        time.sleep(0.2)
    for pid in pids.values():
        if pid_alive(pid):
            try:
                os.killpg(pid, signal.SIGKILL)
            except OSError:
                pass
    _record_path(s).unlink(missing_ok=True)
    return list(pids)


def status(s: Settings) -> dict[str, bool]:
    """Each recorded service: alive and healthy, at the port ``up`` chose (not today's env)."""
    out = {}
    for name, info in read_services(s.run_dir).get("services", {}).items():
        health = info.get("health")
        out[name] = pid_alive(int(info["pid"])) and (not health or healthy(health))
    return out


def require(url: str, what: str) -> None:
    """Raise a clear error naming ``make up`` when the server at ``url`` does not answer."""
    if not healthy(url):
        raise InfraError(f"{what} is not running at {url}: start the servers with `make up`")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="infra/services.py", description=__doc__.split("\n")[0])
    ap.add_argument("action", choices=["up", "down", "status"])
    ap.add_argument("--only", default="", help="comma list of services (default: all but ray)")
    ap.add_argument("--with-ray", action="store_true", help="also start a Ray head")
    args = ap.parse_args(argv)
    s = Settings.from_env()
    try:
        if args.action == "up":
            chosen = [x for x in args.only.split(",") if x] or ["prefect", "worker", "mlflow", "s3"]
            if args.with_ray and "ray" not in chosen:
                chosen.append("ray")
            unknown = sorted(set(chosen) - set(SERVICES))
            if unknown:
                ap.error(f"--only: unknown service(s) {unknown}; known: {', '.join(SERVICES)}")
            if "worker" in chosen and "prefect" in chosen:  # the worker needs the API first
                chosen.remove("worker")
                chosen.insert(chosen.index("prefect") + 1, "worker")
            up(s, chosen)
            print(f"\nPrefect UI  http://{s.host}:{s.prefect_port} (it asks for the string after")
            print(f"            PREFECT_API_AUTH_STRING= in {s.run_dir / 'env.sh'})")
            print(f"MLflow UI   {s.mlflow_uri}")
            print(f"S3 endpoint {s.s3_endpoint}\nclients:    source {s.run_dir / 'env.sh'}")
        elif args.action == "down":
            stopped = down(s)
            print(f"stopped: {', '.join(stopped) or 'nothing was running'}")
        else:
            st = status(s)
            recorded = read_services(s.run_dir).get("services", {})
            for name, ok in st.items():
                where = (recorded[name].get("health") or "").removesuffix("/health")
                print(f"{name:8s} {'up' if ok else 'DOWN':4s} {where.removesuffix('/api')}")
            if not st:
                print("nothing running: `make up` starts the servers")
            return 0 if st and all(st.values()) else 1
    except InfraError as e:
        print(f"infra: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
