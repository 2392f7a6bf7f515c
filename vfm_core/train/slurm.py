"""Submit a training run to Slurm: ``sbatch infra/slurm/train.sbatch`` (one torchrun per node,
c10d rendezvous on the first node, the one entry point ``vfm_core.train.main``) and wait for it.

The template stays the cluster's file; what a run changes comes from the command line and the
environment the template reads: ``--nodes``, the GPUs per node (``--gpus-per-node=0`` for CPU
nodes, overriding the template's request), ``CONFIG`` / ``OUT`` / ``GPUS_PER_NODE`` (processes per
node) / ``VFM_ROOT`` / ``VFM_MAX_RESTARTS`` / ``VFM_RDZV_PORT`` / ``VFM_RESUME``, and ``PATH``
with this interpreter's directory first (so ``torchrun`` is this environment's). The layout's
degrees are in the config's ``parallel`` section. The job's log is ``OUT/slurm-JOBID.log``; its
last JSON line is the trainer's summary.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vfm_core.errors import UserError

TEMPLATE = Path(__file__).resolve().parents[2] / "infra" / "slurm" / "train.sbatch"
TERMINAL = (
    "COMPLETED",
    "FAILED",
    "CANCELLED",
    "TIMEOUT",
    "NODE_FAIL",
    "OUT_OF_MEMORY",
    "PREEMPTED",
    "BOOT_FAIL",
    "DEADLINE",
)


class SlurmError(UserError, RuntimeError):
    """No Slurm, a submission the controller refused, or a job that did not complete."""


@dataclass(kw_only=True, slots=True)
class SlurmOptions:
    nodes: int = 1
    """Nodes of the job (one torchrun each)."""
    nproc_per_node: int = 1
    """Training processes per node (GPUs per node on a GPU cluster)."""
    gpus_per_node: int | None = None
    """GPUs to request per node (None: the template's; 0: CPU nodes)."""
    cpus_per_task: int | None = None
    """CPUs per node task (None: the template's)."""
    partition: str | None = None
    """Partition (None: the cluster's default)."""
    max_restarts: int = 0
    """torchrun restarts of the whole job after a lost rank (resumes from the last checkpoint)."""
    rdzv_port: int = 29500
    """Port of the c10d rendezvous on the first node."""
    time_limit: str | None = None
    """Wall-clock limit, Slurm syntax (None: the template's)."""
    script: Path = TEMPLATE
    """The sbatch template."""
    poll_s: float = 2.0
    """Seconds between job state checks."""
    timeout_s: float | None = None
    """Give up waiting (the job keeps running) after this long; None = wait until it ends."""
    extra_env: dict[str, str] = field(default_factory=dict)
    """More environment for the job (e.g. MLFLOW_TRACKING_URI, MLFLOW_RUN_ID)."""

    @classmethod
    def from_env(cls, **kw: Any) -> SlurmOptions:
        """Options with the cluster's settings from the environment (a Prefect work pool's job
        variables): VFM_SLURM_PARTITION, VFM_SLURM_GPUS_PER_NODE, VFM_SLURM_CPUS_PER_TASK,
        VFM_SLURM_TIME; ``kw`` for the rest."""
        env = os.environ
        num = lambda k: int(env[k]) if env.get(k, "").strip() else None  # noqa: E731
        return cls(
            partition=env.get("VFM_SLURM_PARTITION") or None,
            gpus_per_node=num("VFM_SLURM_GPUS_PER_NODE"),
            cpus_per_task=num("VFM_SLURM_CPUS_PER_TASK"),
            time_limit=env.get("VFM_SLURM_TIME") or None,
            **kw,
        )


@dataclass(kw_only=True, slots=True)
class SlurmJob:
    job_id: str
    state: str
    exit_code: str
    log: Path
    summary: dict[str, Any] | None
    """The trainer's JSON summary (its last stdout line), when the job wrote one."""


def _need(tool: str) -> str:
    path = shutil.which(tool)
    if path is None:
        raise SlurmError(
            f"no Slurm: {tool} not found on PATH (run on a Slurm login node, or install slurm-wlm)"
        )
    return path


def submit_training(
    config: str | Path,
    out_dir: str | Path,
    *,
    options: SlurmOptions | None = None,
    resume: bool = False,
) -> SlurmJob:
    """Submit the run (``resume``: continue the run in ``out_dir``) and wait for its end (see the
    module docstring); SlurmError when there is no Slurm, the controller refuses or cannot be
    reached, or the job does not complete."""
    o = options or SlurmOptions()
    sbatch = _need("sbatch")
    _need("scontrol")
    if not o.script.is_file():
        raise SlurmError(f"sbatch template {o.script} not found")
    out = Path(out_dir).resolve()
    out.mkdir(parents=True, exist_ok=True)
    argv = [sbatch, "--parsable", f"--nodes={o.nodes}", f"--output={out}/slurm-%j.log"]
    if o.gpus_per_node is not None:
        argv.append(f"--gpus-per-node={o.gpus_per_node}")
    if o.cpus_per_task:
        argv.append(f"--cpus-per-task={o.cpus_per_task}")
    if o.partition:
        argv.append(f"--partition={o.partition}")
    if o.time_limit:
        argv.append(f"--time={o.time_limit}")
    argv.append(str(o.script))
    env = dict(os.environ, **o.extra_env)
    env.update(
        CONFIG=str(Path(config).resolve()),
        OUT=str(out),
        GPUS_PER_NODE=str(o.nproc_per_node),
        VFM_ROOT=str(TEMPLATE.parents[2]),
        VFM_MAX_RESTARTS=str(o.max_restarts),
        VFM_RDZV_PORT=str(o.rdzv_port),
        VFM_RESUME="1" if resume else "0",
        PATH=os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")]),
    )
    try:
        r = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired:
        raise SlurmError(
            "sbatch did not answer within 60 s: the Slurm controller is not reachable"
        ) from None
    if r.returncode != 0:
        msg = (r.stderr or r.stdout).strip().splitlines()
        raise SlurmError(f"sbatch refused the job: {msg[-1] if msg else f'exit {r.returncode}'}")
    job_id = r.stdout.strip().split(";")[0]
    return wait_for_job(job_id, out / f"slurm-{job_id}.log", poll_s=o.poll_s, timeout_s=o.timeout_s)


NEVER_RUNS = (
    "PartitionConfig",
    "BadConstraints",
    "PartitionNodeLimit",
    "PartitionTimeLimit",
    "InvalidQOS",
    "InvalidAccount",
    "QOSMaxCpuPerJobLimit",
)
"""Pending reasons that no waiting resolves (the job asks for more than the partition has)."""


def job_state(job_id: str) -> tuple[str, str, str]:
    """(JobState, ExitCode, Reason) of a job from ``scontrol show job``."""
    r = subprocess.run(
        [_need("scontrol"), "show", "job", "-o", job_id], capture_output=True, text=True, timeout=30
    )
    if r.returncode != 0:
        raise SlurmError(f"scontrol show job {job_id}: {(r.stderr or r.stdout).strip()}")
    found = {k: re.search(rf"\b{k}=(\S+)", r.stdout) for k in ("JobState", "ExitCode", "Reason")}
    state, code, reason = (m.group(1) if m else "?" for m in found.values())
    return state, code, reason


def wait_for_job(
    job_id: str, log: Path, *, poll_s: float = 2.0, timeout_s: float | None = None
) -> SlurmJob:
    """Poll until the job ends; SlurmError with the log's tail unless it COMPLETED."""
    start = time.monotonic()
    while True:
        state, code, reason = job_state(job_id)
        if state in TERMINAL:
            break
        if state == "PENDING" and reason in NEVER_RUNS:
            subprocess.run([_need("scancel"), job_id], capture_output=True, timeout=30)
            raise SlurmError(
                f"job {job_id} can never start ({reason}: it asks for more than the partition "
                "has, e.g. CPUs or GPUs per node; set VFM_SLURM_CPUS_PER_TASK / "
                "VFM_SLURM_GPUS_PER_NODE); cancelled"
            )
        if timeout_s is not None and time.monotonic() - start > timeout_s:
            raise SlurmError(f"job {job_id} still {state} after {timeout_s:.0f} s (log: {log})")
        time.sleep(poll_s)
    lines = log.read_text(errors="replace").splitlines() if log.is_file() else []
    if state != "COMPLETED":
        tail = "\n".join(lines[-15:])
        raise SlurmError(f"job {job_id} ended {state} (exit {code}); log {log}:\n{tail}")
    summary = next((json.loads(ln) for ln in reversed(lines) if ln.startswith("{")), None)
    return SlurmJob(job_id=job_id, state=state, exit_code=code, log=log, summary=summary)
