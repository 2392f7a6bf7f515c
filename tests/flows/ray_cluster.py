"""A real multi-node Ray cluster on this machine: a head and worker nodes, each its own
`ray start --block` process group, with its own temp dir and free ports.

Teardown signals these process groups only (never `ray stop`, which kills every Ray process on
the machine, other users' included). Ray 2.60 rewrites `--node-ip-address=127.0.0.1` to the
host's routable address and its gRPC servers listen on all interfaces; a multi-node cluster
cannot be confined to loopback (Ray refuses worker nodes once loopback-only mode is set).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
RAY = str(Path(sys.executable).parent / "ray")
READY = "block forever"  # printed by `ray start --block` once the node runs


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start(args: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen:
    with open(log, "w") as f:
        return subprocess.Popen(
            [RAY, "start", "--block", "--disable-usage-stats", *args],
            stdout=f,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=REPO,
            start_new_session=True,
        )


def _wait_ready(proc: subprocess.Popen, log: Path, timeout_s: float) -> None:
    t0 = time.monotonic()
    while READY not in log.read_text():
        if proc.poll() is not None or time.monotonic() - t0 > timeout_s:
            tail = "\n".join(log.read_text().splitlines()[-15:])
            raise RuntimeError(f"ray start failed ({' '.join(proc.args[2:6])}):\n{tail}")
        time.sleep(0.2)


def _stop(proc: subprocess.Popen) -> None:
    """SIGTERM to `ray start --block` (it shuts its node down), then SIGKILL to its group."""
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # whatever of this node is left
    except ProcessLookupError:
        pass
    proc.wait(timeout=10)


@contextmanager
def ray_cluster(*, workers: int = 1, cpus_per_node: int = 1) -> Iterator[str]:
    """Yields the head's "127.0.0.1:PORT"; every node runs from this venv with PYTHONPATH=REPO."""
    # short temp dir: Ray's unix sockets live under it (108-byte limit)
    root = Path(tempfile.mkdtemp(prefix="vfmray-", dir="/tmp"))
    env = dict(
        os.environ, RAY_AUTH_MODE="disabled", RAY_USAGE_STATS_ENABLED="0", PYTHONPATH=str(REPO)
    )
    port = free_port()
    common = [f"--num-cpus={cpus_per_node}", "--object-store-memory=100000000"]
    procs: list[subprocess.Popen] = []
    try:
        head = _start(
            [
                "--head",
                "--node-ip-address=127.0.0.1",
                f"--port={port}",
                "--include-dashboard=false",
                f"--dashboard-port={free_port()}",
                f"--ray-client-server-port={free_port()}",
                f"--dashboard-agent-listen-port={free_port()}",
                f"--temp-dir={root / 'h'}",
                *common,
            ],
            root / "head.log",
            env,
        )
        procs.append(head)
        _wait_ready(head, root / "head.log", 60)
        for i in range(workers):
            log = root / f"worker{i}.log"
            w = _start(
                [
                    f"--address=127.0.0.1:{port}",
                    f"--dashboard-agent-listen-port={free_port()}",
                    f"--temp-dir={root / f'w{i}'}",
                    *common,
                ],
                log,
                env,
            )
            procs.append(w)
            _wait_ready(w, log, 60)
        yield f"127.0.0.1:{port}"
    finally:
        for p in reversed(procs):
            _stop(p)
        shutil.rmtree(root, ignore_errors=True)
