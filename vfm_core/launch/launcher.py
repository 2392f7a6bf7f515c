"""Launch the entry points under torchrun: training (:mod:`vfm_core.train.main`) and
generation (:mod:`vfm_core.infer.main`), one design with the entry point as the parameter.

:func:`torchrun_argv` is the command line every training launcher uses: ``vfm train --nproc N``,
the Prefect training task, and the cluster templates in ``infra/`` (Slurm, Kubernetes), which fill
in the node count, node rank and rendezvous endpoint from their own variables;
:func:`run_launch` starts and waits for the ranks of either entry point (:func:`launch_training`,
:func:`launch_generation`), and :func:`prepare_training` is what every training launch, Slurm's
included, does before its ranks start.

* one node: ``--standalone`` (a private rendezvous on a free local port);
* several nodes: a c10d rendezvous on ``--rdzv-endpoint HOST:PORT``; node rank 0 hosts the
  rendezvous store (``is_host``), the others join it and give up with a clear error after
  ``rdzv_timeout`` seconds; ``nproc`` is per node and the layout's degrees multiply to
  ``nnodes * nproc``;
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
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path

from vfm_core.config import DEGREES, ConfigError
from vfm_core.train.preempt import StopRequest

TORCHRUN = "vfm_core.train.torchrun"
"""torch.distributed.run, a stop signal ending it in one line."""

ENTRY = "vfm_core.train.main"


@dataclass(kw_only=True, slots=True)
class Launch:
    """Where the ranks of a run come from (the ``vfm train`` / training-form flags)."""

    nproc: int = 1
    """Processes (GPUs) per node."""
    nnodes: int = 1
    """Nodes taking part; > 1 needs ``rdzv_endpoint``."""
    node_rank: int = 0
    """This node's index, 0 .. nnodes - 1 (node 0 hosts the rendezvous)."""
    rdzv_endpoint: str = ""
    """HOST:PORT of the c10d rendezvous (multi-node)."""
    rdzv_timeout: int = 300
    """Seconds a node waits for the others to join before it gives up."""
    max_restarts: int = 0
    """Restarts of all ranks after a rank dies (resuming from the last checkpoint)."""

    def __post_init__(self) -> None:
        if self.nproc < 1:
            raise ConfigError(f"--nproc: must be >= 1, got {self.nproc}")
        if self.nnodes < 1:
            raise ConfigError(f"--nnodes: must be >= 1, got {self.nnodes}")
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
        if self.rdzv_timeout < 1:
            raise ConfigError(f"--rdzv-timeout: must be >= 1 s, got {self.rdzv_timeout}")
        if self.max_restarts < 0:
            raise ConfigError(f"--max-restarts: must be >= 0, got {self.max_restarts}")

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
    """``torchrun ...`` (:mod:`vfm_core.train.torchrun`: torch's, ending in one line on a stop
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


def torchrun_argv(
    launch: Launch | int,
    *,
    config: str | Path,
    out: str | Path,
    resume: bool = False,
    **degrees: int | None,
) -> list[str]:
    """``torchrun`` command running :mod:`vfm_core.train.main` on this
    node's ranks (``launch``: a :class:`Launch`, or the process count of one node);
    ``degrees`` (e.g. ``tp=2``) override the config's parallel section."""
    if isinstance(launch, int):
        launch = Launch(nproc=launch)
    argv = torchrun_prefix(launch)
    argv += ["-m", ENTRY, "--config", str(config), "--out", str(out), "--no-progress"]
    for name, value in degrees.items():
        if name not in DEGREES:
            raise ConfigError(f"parallel degree {name!r} unknown (known: {DEGREES})")
        if value is not None:
            argv += [f"--{name.replace('_', '-')}", str(value)]
    return argv + (["--resume"] if resume else [])


def entry_argv(
    launch: Launch,
    *,
    config: str | Path,
    out: str | Path,
    resume: bool = False,
    resume_from: str | Path | None = None,
    debug: bool = False,
) -> list[str]:
    """The command that runs the one entry point for ``launch``: torchrun over this node's ranks,
    or the entry point itself in one process (one rank, nothing to restart)."""
    if launch.in_process:
        argv = [sys.executable, "-m", ENTRY, "--config", str(config), "--out", str(out)]
        argv += ["--no-progress"] + (["--resume"] if resume else [])
    else:
        argv = torchrun_argv(launch, config=config, out=out, resume=resume)
    argv += ["--resume-from", str(resume_from)] if resume_from else []
    return argv + (["--debug"] if debug else [])


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
    (0: none): the ranks saved and stopped (:mod:`vfm_core.train.preempt`)."""

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


@contextmanager
def prepare_training(
    cfg,
    out: str | Path,
    *,
    world_size: int,
    max_restarts: int = 0,
    name: str = "run.yaml",
    hold_lock: bool = True,
) -> Iterator[Path]:
    """Everything before a training run's ranks start, wherever they start (this node, or the
    Slurm template), held for the block in which they run: the layout over ``world_size`` ranks
    and the restarts checked (one clear error, nothing started), ``out`` checked writable, its
    writer lock taken (:mod:`vfm_core.output_lock`; a second run into ``out`` is refused here;
    ``hold_lock`` False: the launcher of node 0 holds it), and the run config written there as
    ``name`` (the layout's degrees included: every rank reads them from it). Yields its path;
    start the ranks with :func:`~vfm_core.output_lock.lock_env` so that rank 0 knows its launcher
    holds the lock."""
    from vfm_core.config import save_yaml
    from vfm_core.output_lock import output_lock
    from vfm_core.parallel.layout import validate_layout
    from vfm_core.train.main import check_out_dir, check_restartable

    validate_layout(cfg, world_size)
    check_restartable(cfg, max_restarts)
    out = Path(out)
    new = not out.exists()
    check_out_dir(out)  # a file, or a read-only place: one line naming --out, nothing started
    with output_lock(out, what="--out", new=new) if hold_lock else nullcontext():
        config = out / name
        save_yaml(cfg, config)
        yield config


def launch_training(
    cfg,
    out: str | Path,
    *,
    launch: Launch,
    resume: bool = False,
    resume_from: str | Path | None = None,
    debug: bool = False,
    env: dict[str, str] | None = None,
    on_line=None,
) -> LaunchResult:
    """The one way a run is launched on this node (``vfm train --nproc``, the Prefect training
    task; the Slurm path of that task prepares the run with :func:`prepare_training` and the
    cluster template runs the same entry point): :func:`prepare_training` (node 0 holding the
    run's writer lock until its ranks end), the rendezvous waited for on joining nodes, then the
    entry point started (:func:`run_launch`)."""
    from vfm_core.output_lock import lock_env

    name = f"run-node{launch.node_rank}.yaml" if launch.nnodes > 1 else "run.yaml"
    with prepare_training(
        cfg,
        out,
        world_size=launch.world_size,
        max_restarts=launch.max_restarts,
        name=name,
        hold_lock=launch.node_rank == 0,
    ) as config:
        wait_for_rendezvous(launch)
        argv = entry_argv(
            launch, config=config, out=out, resume=resume, resume_from=resume_from, debug=debug
        )
        return run_launch(argv, env=lock_env(out, env), on_line=on_line)


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
    task, through :func:`vfm_core.infer.generate.generate_request`): torchrun over
    :mod:`vfm_core.infer.main` with ``args`` (its flags); the result is the JSON file ``result``
    rank 0 writes beside the video (:func:`run_launch`)."""
    launch = Launch(nproc=nproc)
    argv = torchrun_prefix(launch, rdzv_id="vfm-generate") + ["-m", GENERATE_ENTRY, *args]
    return run_launch(argv, result=result, env=env, on_line=on_line)
