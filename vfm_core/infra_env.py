"""One place to look: when the servers of ``make up`` are running, clients use them.

``infra/services.py up`` records what it started in ``$VFM_INFRA_DIR/services.json`` (default
``$VFM_DATA_DIR/infra``): each service's pid, port and health URL, and the client settings
(``PREFECT_API_URL`` and its auth string, ``MLFLOW_TRACKING_URI``, the S3 endpoint and its keys;
the file is the owner's only, 0600). :func:`use_running_services` copies the settings of the
services that are alive and healthy into the environment, never over a variable the user set, so
``make demo``, ``vfm ...`` and the flows log to the MLflow server and the Prefect server a user
has open; with nothing running they keep the embedded defaults (a sqlite store under the data
dir, an ephemeral Prefect API). ``VFM_NO_SERVICES=1`` opts out. A service's address and its
credentials go together: where the user set the address (``PREFECT_API_URL=...``) none of the
service's settings are used (its secret is never sent to another server); where the address comes
from the record, so do its credentials (:data:`CREDENTIAL_VARS`), over the user's own (AWS keys of
a real account would only be refused by the local endpoint).

Without a server a flow starts Prefect's temporary API, which needs ``$PREFECT_HOME`` (its sqlite
database) to exist and more than Prefect's 20 s to start on a busy machine:
:func:`prefect_without_server` sees to both (the ``flows`` package calls it on import). The
library's own log lines (the progress of long steps, :mod:`vfm_core.progress`) reach the Prefect
run log through :func:`prefect_logs_library`, called there too.

Call these before ``prefect`` is imported: Prefect reads its settings at import time. No torch,
prefect or mlflow import here.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import tomllib
import urllib.error
import urllib.request
import warnings
from pathlib import Path

from vfm_core.tracking import data_dir

SERVICE_VARS: dict[str, tuple[str, ...]] = {
    "prefect": ("PREFECT_API_URL", "PREFECT_API_AUTH_STRING"),
    "mlflow": ("MLFLOW_TRACKING_URI",),
    "s3": ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION"),
}
"""The client variables each service provides, its address first."""

CREDENTIAL_VARS = frozenset(
    {"PREFECT_API_AUTH_STRING", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"}
)
"""The variables of :data:`SERVICE_VARS` that are secrets of that service's address."""


def infra_dir() -> Path:
    """Where ``make up`` keeps its state: $VFM_INFRA_DIR, else the data dir's ``infra``."""
    env = os.environ.get("VFM_INFRA_DIR")
    return Path(env).resolve() if env else data_dir() / "infra"


def services_file(root: Path | None = None) -> Path:
    return (root or infra_dir()) / "services.json"


def read_services(root: Path | None = None) -> dict:
    """The record ``make up`` wrote ({} when there is none); one that cannot be read, or is not
    ``{"env": {VAR: value}, "services": {name: {"pid": int, ...}}}``, is {} with a warning
    naming the file (every command reads it first: it must not stop them)."""
    path = services_file(root)
    if not path.exists():
        return {}
    try:
        record = json.loads(path.read_text())
        problem = _record_problem(record)
    except (OSError, ValueError) as e:
        problem = f"cannot be read ({e})"
    if problem:
        warnings.warn(f"{path}: {problem}; ignored (`make up` writes it anew)", stacklevel=2)
        return {}
    return record


def _record_problem(record: object) -> str | None:
    """Why ``record`` is not a services record, or None."""
    if not isinstance(record, dict):
        return f"expected a JSON object, got {type(record).__name__}"
    env, services = record.get("env", {}), record.get("services", {})
    if not isinstance(env, dict) or not isinstance(services, dict):
        return "'env' and 'services' must be JSON objects"
    for name, info in services.items():
        pid = info.get("pid") if isinstance(info, dict) else None
        if not isinstance(pid, int) or isinstance(pid, bool):
            return f"services.{name}: expected an object with an integer 'pid'"
    return None


def pid_alive(pid: object) -> bool:
    """Running (a zombie is not; another user's process is); not a positive int: False."""
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except PermissionError:  # another user's process
        return True
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
    return _alive(read_services(root))


def _alive(record: dict) -> dict[str, dict]:
    services = record.get("services", {})
    return {
        name: info
        for name, info in services.items()
        if pid_alive(info["pid"]) and (not info.get("health") or healthy(info["health"]))
    }


def use_running_services(root: Path | None = None) -> dict[str, str]:
    """Point this process at the running servers of ``make up`` (variables the user set win,
    credentials follow their address: see the module's docstring); returns the variables it
    set."""
    if os.environ.get("VFM_NO_SERVICES") == "1":
        return {}
    record = read_services(root)
    env = record.get("env", {}) if record else {}
    chosen: dict[str, str] = {}
    for name in _alive(record) if env else {}:
        names = SERVICE_VARS.get(name, ())
        if names and names[0] in os.environ:  # the user's own server: none of these settings
            continue
        for var in names:
            if var in env and (var not in os.environ or var in CREDENTIAL_VARS):
                chosen[var] = str(env[var])
    os.environ.update(chosen)
    return chosen


PREFECT_DEFAULTS: dict[str, str] = {
    "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "90",
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
}
"""Prefect settings for a flow without a server: the temporary API took 10-22 s to start on a
2-core machine (Prefect's timeout: 20 s), and its telemetry job logs "database is locked"."""


def prefect_profile() -> dict[str, str]:
    """The settings of the active Prefect profile (``$PREFECT_PROFILE`` or the file's
    ``active``) in ``$PREFECT_PROFILES_PATH`` (default ``$PREFECT_HOME/profiles.toml``)."""
    home = Path(os.environ.get("PREFECT_HOME") or "~/.prefect").expanduser()
    path = Path(os.environ.get("PREFECT_PROFILES_PATH") or home / "profiles.toml").expanduser()
    try:
        doc = tomllib.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    name = os.environ.get("PREFECT_PROFILE") or doc.get("active", "ephemeral")
    profile = doc.get("profiles", {}).get(name, {})
    return {k: str(v) for k, v in profile.items()} if isinstance(profile, dict) else {}


def prefect_without_server() -> dict[str, str]:
    """Let a flow run on Prefect's temporary API (no ``PREFECT_API_URL``): the settings of
    :data:`PREFECT_DEFAULTS` the user set neither in the environment nor in the active profile,
    and the directories of ``$PREFECT_HOME`` and of a sqlite database URL, created (Prefect does
    neither). Returns the variables it set."""
    profile = prefect_profile()
    chosen = {k: v for k, v in PREFECT_DEFAULTS.items() if k not in os.environ and k not in profile}
    os.environ.update(chosen)
    folders = [Path(os.environ.get("PREFECT_HOME") or "~/.prefect").expanduser()]
    for var in ("PREFECT_SERVER_DATABASE_CONNECTION_URL", "PREFECT_API_DATABASE_CONNECTION_URL"):
        url = os.environ.get(var) or profile.get(var, "")
        if url.startswith("sqlite") and ":///" in url and ":memory:" not in url:
            folders.append(Path(url.split(":///", 1)[1].split("?")[0]).expanduser().parent)
    for folder in folders:
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError:
            pass  # Prefect names the folder it cannot use
    return chosen


EXTRA_LOGGERS = "PREFECT_LOGGING_EXTRA_LOGGERS"
LIBRARY_LOGGER = "vfm_core"


def extra_loggers_with(name: str, current: str) -> str:
    """``current`` (Prefect's comma-separated extra loggers) with ``name`` added once."""
    names = [n.strip() for n in current.split(",") if n.strip()]
    return ",".join(names if name in names else [*names, name])


def prefect_logs_library(name: str = LIBRARY_LOGGER) -> None:
    """The library's INFO lines (progress) in the Prefect run log and on its console: ``name``
    added to ``PREFECT_LOGGING_EXTRA_LOGGERS`` (the user's list, from the environment or the
    active profile, kept), the logger at INFO unless a level was set for it, and, where Prefect
    was imported first (its settings already read: a worker's flow-run process), Prefect's API
    handler attached to it as Prefect's ``setup_logging`` does for the loggers it names."""
    current = os.environ.get(EXTRA_LOGGERS) or prefect_profile().get(EXTRA_LOGGERS, "")
    os.environ[EXTRA_LOGGERS] = extra_loggers_with(name, current)
    lib = logging.getLogger(name)
    if lib.level == logging.NOTSET:
        lib.setLevel(logging.INFO)
    if "prefect" in sys.modules:
        for handler in logging.getLogger("prefect.extra").handlers:
            if handler not in lib.handlers:
                lib.addHandler(handler)
