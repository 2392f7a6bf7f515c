"""One place to look: when the servers of ``make up`` are running, clients use them.

``infra/services.py up`` records what it started in ``$VFM_INFRA_DIR/services.json`` (default
``$VFM_DATA_DIR/infra``): each service's pid, port and health URL, and the client settings
(``PREFECT_API_URL``, ``MLFLOW_TRACKING_URI``, the S3 endpoint). :func:`use_running_services`
copies the settings of the services that are alive and healthy into the environment, never over a
variable the user set, so ``make demo``, ``vfm ...`` and the flows log to the MLflow server and the
Prefect server a user has open; with nothing running they keep the embedded defaults (a sqlite
store under the data dir, an ephemeral Prefect API). ``VFM_NO_SERVICES=1`` opts out.

Call it before ``prefect`` is imported: Prefect reads its settings at import time. No torch,
prefect or mlflow import here.
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from pathlib import Path

from vfm_core.tracking import data_dir

SERVICE_VARS: dict[str, tuple[str, ...]] = {
    "prefect": ("PREFECT_API_URL",),
    "mlflow": ("MLFLOW_TRACKING_URI",),
    "s3": ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION"),
}
"""The client variables each service provides."""


def infra_dir() -> Path:
    """Where ``make up`` keeps its state: $VFM_INFRA_DIR, else the data dir's ``infra``."""
    env = os.environ.get("VFM_INFRA_DIR")
    return Path(env).resolve() if env else data_dir() / "infra"


def services_file(root: Path | None = None) -> Path:
    return (root or infra_dir()) / "services.json"


def read_services(root: Path | None = None) -> dict:
    """The record ``make up`` wrote ({} when there is none or it cannot be read)."""
    path = services_file(root)
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return record if isinstance(record, dict) else {}


def pid_alive(pid: int) -> bool:
    """Running (a zombie is not)."""
    try:
        os.kill(pid, 0)
    except (OSError, OverflowError):
        return False
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def healthy(url: str, timeout: float = 2.0) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status < 500
    except (urllib.error.URLError, OSError, ValueError):
        return False


def running_services(root: Path | None = None) -> dict[str, dict]:
    """The recorded services whose process is alive and whose health URL (if any) answers."""
    services = read_services(root).get("services", {})
    return {
        name: info
        for name, info in services.items()
        if isinstance(info, dict)
        and pid_alive(int(info.get("pid", -1)))
        and (not info.get("health") or healthy(info["health"]))
    }


def use_running_services(root: Path | None = None) -> dict[str, str]:
    """Point this process at the running servers of ``make up`` (variables the user set win);
    returns the variables it set."""
    if os.environ.get("VFM_NO_SERVICES") == "1":
        return {}
    record = read_services(root)
    env = record.get("env", {}) if record else {}
    chosen: dict[str, str] = {}
    for name in running_services(root) if env else {}:
        for var in SERVICE_VARS.get(name, ()):
            if var in env and var not in os.environ:
                chosen[var] = str(env[var])
    os.environ.update(chosen)
    return chosen
