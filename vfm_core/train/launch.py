"""Launch training under torchrun: :func:`torchrun_argv` is the command line every training
launcher uses: ``vfm train --nproc N``, the Prefect training task, and the cluster templates in
``infra/`` (Slurm, Kubernetes), which fill in the node count, node rank and rendezvous endpoint
from their own variables; :func:`launch_training` starts and waits for the ranks of
:mod:`vfm_core.train.main` through the one launcher (:mod:`vfm_core.launch.launcher`), and
:func:`prepare_training` is what every training launch, Slurm's included, does before its ranks
start. Under several nodes the layout's degrees multiply to ``nnodes * nproc``.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path

from vfm_core.config import DEGREES, ConfigError
from vfm_core.launch.launcher import (
    Launch,
    LaunchResult,
    run_launch,
    torchrun_prefix,
    wait_for_rendezvous,
)

ENTRY = "vfm_core.train.main"


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
