"""Launch an entry point's ranks under torchrun, one design with the entry point as the
parameter: training (:mod:`vfm_core.train.launch` over :mod:`vfm_core.train.main`) and generation
(:func:`launch_generation`, :mod:`vfm_core.infer.main`).

:func:`torchrun_prefix` is the ``torchrun`` command line up to the entry point (this node's ranks,
the rendezvous); :func:`run_launch` starts and waits for the ranks of either entry point, passing
on the stop signals this process receives (:func:`forward_stop_signals`).

* one node: ``--standalone`` (a private rendezvous on a free local port);
* several nodes: a c10d rendezvous on ``--rdzv-endpoint HOST:PORT``; node rank 0 hosts the
  rendezvous store (``is_host``), the others join it and give up with a clear error after
  ``rdzv_timeout`` seconds (:func:`wait_for_rendezvous`); ``nproc`` is per node;
* ``max_restarts`` K: torchrun restarts every rank of the job when one dies, up to K times; the
  restarted ranks resume from the newest complete checkpoint (:mod:`vfm_core.train.main`).
"""

from __future__ import annotations

import contextlib
import json
import signal
import socket
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from vfm_core.config import ConfigError
from vfm_core.config_fields import bounds, out_of_bounds
from vfm_core.launch.preempt import StopRequest

TORCHRUN = "vfm_core.launch.torchrun"
"""torch.distributed.run, a stop signal ending it in one line."""


@dataclass(kw_only=True, slots=True)
class Launch:
    """Where the ranks of a run come from (the ``vfm train`` / training-form flags; the field
    docstrings are their help)."""

    nproc: int = field(default=1, metadata=bounds(ge=1, le=1024))
    """processes (GPUs) per node; > 1 runs torchrun (gloo on CPU)"""
    nnodes: int = field(default=1, metadata=bounds(ge=1, le=4096))
    """nodes of a multi-node run (torchrun c10d rendezvous); > 1 needs --rdzv-endpoint (a slurm
    job sets it)"""
    node_rank: int = field(default=0, metadata=bounds(ge=0))
    """this node's index, 0 .. nnodes - 1 (0 hosts the rendezvous)"""
    rdzv_endpoint: str = field(default="", metadata={"metavar": "HOST:PORT"})
    """rendezvous endpoint of a multi-node run"""
    rdzv_timeout: int = field(default=300, metadata=bounds(ge=1))
    """seconds to wait for the other nodes before giving up"""
    max_restarts: int = field(default=0, metadata=bounds(ge=0, le=100))
    """restart all ranks after one dies, from the last checkpoint"""

    def __post_init__(self) -> None:
        if problem := out_of_bounds(self):
            raise ConfigError(problem)
        if not 0 <= self.node_rank < self.nnodes:
            raise ConfigError(
                f"--node-rank: {self.node_rank} is out of range for --nnodes {self.nnodes} "
                f"(0 .. {self.nnodes - 1})"
            )
        if self.nnodes > 1:
            host, _, port = self.rdzv_endpoint.rpartition(":")
            if not host or not port.isdigit() or not 0 < int(port) < 65536:
                raise ConfigError(
                    f"--rdzv-endpoint: expected HOST:PORT for --nnodes {self.nnodes}, got "
                    f"{self.rdzv_endpoint!r}"
                )

    @property
    def world_size(self) -> int:
        return self.nnodes * self.nproc

    @property
    def in_process(self) -> bool:
        """One rank, nothing to restart: ``vfm train`` runs the entry point in its own
        process."""
        return self.world_size == 1 and self.max_restarts == 0


def wait_for_rendezvous(launch: Launch) -> None:
    """A joining node (rank > 0) first waits for the rendezvous endpoint to accept connections,
    for at most ``rdzv_timeout`` seconds; a ConfigError naming it if it never does (instead of a
    torchrun traceback, or a hang)."""
    if launch.nnodes == 1 or launch.node_rank == 0:
        return
    host, _, port = launch.rdzv_endpoint.rpartition(":")
    deadline = time.monotonic() + launch.rdzv_timeout
    while True:
        try:
            with socket.create_connection((host, int(port)), timeout=2):
                return
        except OSError as e:
            if time.monotonic() >= deadline:
                raise ConfigError(
                    f"--rdzv-endpoint {launch.rdzv_endpoint}: no rendezvous answered within "
                    f"{launch.rdzv_timeout} s ({e.strerror or e}); start node 0 first, or check "
                    "the host and port"
                ) from None
            time.sleep(0.5)


def torchrun_prefix(launch: Launch, *, rdzv_id: str = "vfm-train") -> list[str]:
    """``torchrun ...`` (:mod:`vfm_core.launch.torchrun`: torch's, ending in one line on a stop
    signal) up to the entry point: this node's ranks, a private rendezvous on one node, the c10d
    rendezvous ``rdzv_id`` on several."""
    argv = [sys.executable, "-m", TORCHRUN, f"--nproc-per-node={launch.nproc}"]
    if launch.nnodes == 1:
        argv += ["--standalone"]
    else:
        host_conf = "is_host=true" if launch.node_rank == 0 else "is_host=false"
        argv += [
            f"--nnodes={launch.nnodes}",
            f"--node-rank={launch.node_rank}",
            "--rdzv-backend=c10d",
            f"--rdzv-endpoint={launch.rdzv_endpoint}",
            f"--rdzv-id={rdzv_id}",
            f"--rdzv-conf={host_conf},join_timeout={launch.rdzv_timeout},"
            f"read_timeout={launch.rdzv_timeout}",
        ]
    return argv + [f"--max-restarts={launch.max_restarts}", "--monitor-interval=1"]


@dataclass(kw_only=True, slots=True)
class LaunchResult:
    """How a launched run ended."""

    returncode: int
    """The launcher's exit code (0: every rank finished)."""
    summary: dict | None
    """What the entry point reported: the JSON of its ``result`` file when the launch named one
    (generation), else its JSON summary line (rank 0's last stdout line, training), when it
    wrote one."""
    lines: list[str]
    """The output lines, when they were captured (``on_line`` given), else []."""
    signum: int = 0
    """A stop signal (SIGTERM / SIGUSR1) this process received and passed on to the launcher
    (0: none): the ranks saved and stopped (:mod:`vfm_core.launch.preempt`)."""

    def error_line(self) -> str:
        """The ranks' one-line error (``error: ...``, a user error) from the captured output,
        or ''."""
        return next((ln.strip() for ln in reversed(self.lines) if "error:" in ln), "")


class LaunchError(RuntimeError):
    """Launched ranks exited with a non-zero code (their one-line error, when captured)."""

    def __init__(self, what: str, returncode: int, reason: str = "") -> None:
        self.returncode, self.reason = returncode, reason
        super().__init__(f"{what} failed (exit {returncode})" + (f": {reason}" if reason else ""))


def run_launch(
    argv: list[str],
    *,
    result: str | Path | None = None,
    env: dict[str, str] | None = None,
    on_line=None,
) -> LaunchResult:
    """Run a launch command and report how it ended: the one place ranks are started and waited
    for (training and generation). ``result``: a JSON file the entry point writes when it
    finishes, read as the summary (removed first, so an earlier run's is never taken for this
    one's); without it the summary is the last JSON line of the captured output. ``on_line(line)``
    receives every output line (the tasks log them); without it the ranks share this process's
    terminal (progress bars, one-line errors)."""
    import subprocess

    if result is not None:
        Path(result).unlink(missing_ok=True)
    lines: list[str] = []
    capture = {} if on_line is None else {"stdout": subprocess.PIPE, "stderr": subprocess.STDOUT}
    popen = subprocess.Popen(argv, text=True, env=env, **capture)
    with forward_stop_signals(popen) as forwarded:
        if on_line is not None:
            assert popen.stdout is not None
            for line in popen.stdout:
                lines.append(line.rstrip("\n"))
                on_line(line)
        code = popen.wait()
    if result is not None:
        path = Path(result)
        summary = json.loads(path.read_text()) if code == 0 and path.is_file() else None
    else:
        summary = next((json.loads(ln) for ln in reversed(lines) if ln.startswith("{")), None)
    return LaunchResult(returncode=code, summary=summary, lines=lines, signum=forwarded.signum)


@contextmanager
def forward_stop_signals(child) -> Iterator[StopRequest]:
    """While ``child`` (the launcher of the ranks) runs, SIGTERM / SIGUSR1 sent to this process
    (Slurm, Kubernetes, ``kill``) go on to it instead of ending this process: torchrun passes
    them to the ranks, which finish their step and save. Yields the request (``signum``: the
    signal received, 0 if none)."""
    stop = StopRequest()

    def forward(signum: int, frame: object) -> None:
        stop.signum = stop.signum or signum
        with contextlib.suppress(ProcessLookupError):  # torchrun passes SIGTERM on (not USR1)
            child.send_signal(signal.SIGTERM)

    stop.handler = forward
    with stop:
        yield stop


GENERATE_ENTRY = "vfm_core.infer.main"


def launch_generation(
    nproc: int,
    args: list[str],
    *,
    result: str | Path,
    env: dict[str, str] | None = None,
    on_line=None,
) -> LaunchResult:
    """``nproc`` generation ranks on this node (``vfm generate --nproc``, the Prefect generation
    task, through :func:`vfm_core.infer.run.generate_request`): torchrun over
    :mod:`vfm_core.infer.main` with ``args`` (its flags); the result is the JSON file ``result``
    rank 0 writes beside the video (:func:`run_launch`)."""
    launch = Launch(nproc=nproc)
    argv = torchrun_prefix(launch, rdzv_id="vfm-generate") + ["-m", GENERATE_ENTRY, *args]
    return run_launch(argv, result=result, env=env, on_line=on_line)
