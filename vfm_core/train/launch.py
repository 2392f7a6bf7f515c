"""Launch the one training entry point (:mod:`vfm_core.train.main`) under torchrun.

:func:`torchrun_argv` is the command line every launcher uses: ``vfm train --nproc N``, the
Prefect training task, and (with ``$SLURM_*`` / PyTorchJob variables filled in) the cluster
templates in ``infra/``. One node: ``--standalone``. Several: a c10d rendezvous on
``--rdzv-endpoint HOST:PORT``; ``nproc`` is per node and the layout's degrees multiply to
``nnodes * nproc``.
"""

from __future__ import annotations

import sys
from pathlib import Path

from vfm_core.config import ConfigError

ENTRY = "vfm_core.train.main"
DEGREES = ("dp_replicate", "dp_shard", "cp", "tp", "pp")


def torchrun_argv(
    nproc: int,
    *,
    config: str | Path,
    out: str | Path,
    resume: bool = False,
    **degrees: int | None,
) -> list[str]:
    """``python -m torch.distributed.run`` command for ``nproc`` local ranks running
    :mod:`vfm_core.train.main`; ``degrees`` (e.g. ``tp=2``) override the config's parallel
    section."""
    if nproc < 1:
        raise ConfigError(f"--nproc: must be >= 1, got {nproc}")
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    argv += [f"--nproc-per-node={nproc}", "-m", ENTRY, "--config", str(config), "--out", str(out)]
    argv += ["--no-progress"]
    for name, value in degrees.items():
        if name not in DEGREES:
            raise ConfigError(f"parallel degree {name!r} unknown (known: {DEGREES})")
        if value is not None:
            argv += [f"--{name.replace('_', '-')}", str(value)]
    return argv + (["--resume"] if resume else [])
