"""A real single-node Slurm on 127.0.0.1 for the tests: munged, slurmctld and slurmd from Debian's
slurm-wlm (installed by .ci/run), configured in a temp dir with free ports, no cgroups
(proctrack/linuxproc, task/none), stopped by their pid files. Skips when slurm-wlm is missing or
the tests do not run as root (slurmd needs it)."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ensure_munge() -> None:
    if subprocess.run(["munge", "-n"], capture_output=True).returncode == 0:
        return
    for d in ("/run/munge", "/var/log/munge", "/var/lib/munge"):
        os.makedirs(d, exist_ok=True)
        shutil.chown(d, "munge", "munge")
    key = Path("/etc/munge/munge.key")
    if not key.exists():
        key.write_bytes(os.urandom(128))
        key.chmod(0o400)
        shutil.chown(key, "munge", "munge")
    subprocess.run(["runuser", "-u", "munge", "--", "munged", "--force"], capture_output=True)
    deadline = time.monotonic() + 10
    while subprocess.run(["munge", "-n"], capture_output=True).returncode != 0:
        if time.monotonic() > deadline:
            pytest.skip("munged did not start (needed by Slurm's auth/munge)")
        time.sleep(0.2)


def start_cluster(root: Path) -> dict[str, str]:
    """Start slurmctld + slurmd under ``root``; returns the environment for sbatch & co."""
    if shutil.which("slurmctld") is None or shutil.which("sbatch") is None:
        pytest.skip("slurm-wlm is not installed (.ci/run installs it with apt)")
    if os.geteuid() != 0:
        pytest.skip("a single-node Slurm needs root here (slurmd)")
    _ensure_munge()
    host = socket.gethostname()
    for d in ("state", "spool"):
        (root / d).mkdir(parents=True, exist_ok=True)
    conf = root / "slurm.conf"
    conf.write_text(f"""ClusterName=vfmtest
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={_free_port()}
SlurmdPort={_free_port()}
AuthType=auth/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
SelectType=select/cons_tres
SlurmUser=root
SlurmdUser=root
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd.pid
SlurmctldLogFile={root}/slurmctld.log
SlurmdLogFile={root}/slurmd.log
ReturnToService=2
MpiDefault=none
NodeName={host} NodeAddr=127.0.0.1 CPUs={os.cpu_count() or 2} State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
""")
    env = dict(os.environ, SLURM_CONF=str(conf))
    for daemon in ("slurmctld", "slurmd"):
        subprocess.run([daemon], env=env, check=True, timeout=30)
    deadline = time.monotonic() + 60
    while True:
        r = subprocess.run(["sinfo", "-h", "-o", "%t"], env=env, capture_output=True, text=True)
        if r.stdout.strip() == "idle":
            return env
        if time.monotonic() > deadline:
            stop_cluster(root)
            log = (root / "slurmctld.log").read_text()[-2000:]
            pytest.fail(f"the Slurm node did not become idle: {r.stdout} {r.stderr}\n{log}")
        time.sleep(0.5)


def stop_cluster(root: Path) -> None:
    for pid_file in ("slurmd.pid", "slurmctld.pid"):
        p = root / pid_file
        if not p.is_file():
            continue
        try:
            pid = int(p.read_text().strip())
            os.kill(pid, signal.SIGTERM)
            for _ in range(50):
                os.kill(pid, 0)
                time.sleep(0.1)
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, ValueError):
            pass
