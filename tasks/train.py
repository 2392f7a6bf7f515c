"""Prefect tasks around training. Training ranks are never Prefect tasks: the task writes the run
config, launches the one training entry point ``vfm_core.train.main`` (one process, or ``nproc``
ranks under torchrun) as a subprocess, streams its log, and returns small serialisable results (run
id, paths, final metrics)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from prefect import task

from tasks.logs import log_lines, task_logger
from tasks.progress import ProgressArtifact
from vfm_core.config import Config


@task(name="train")
def train_model(
    cfg: Config,
    out_dir: str,
    *,
    resume: bool = False,
    mlflow_run_id: str | None = None,
    nproc: int = 1,
    degrees: dict[str, int] | None = None,
    max_restarts: int = 0,
    launcher: str = "local",
    nnodes: int = 1,
) -> dict[str, Any]:
    """Run the trainer through the one launcher (:func:`vfm_core.train.launch.launch_training`:
    ``nproc`` ranks under torchrun, ``degrees`` such as ``{"tp": 2}`` overriding the config's
    parallel section, its output logged), or submit it to Slurm (``launcher="slurm"``: ``nnodes``
    nodes of ``nproc`` processes, the cluster template); the layout is checked first (one clear
    error before any process starts); raise with its last log lines if it fails."""
    from vfm_core.launch.launcher import Launch
    from vfm_core.parallel.layout import with_degrees
    from vfm_core.train.launch import launch_training, prepare_training

    logger = task_logger()
    if launcher not in ("local", "slurm"):
        raise ValueError(f"launcher: 'local' or 'slurm', got {launcher!r}")
    if launcher == "local" and nnodes != 1:
        raise ValueError(f"nnodes={nnodes}: several nodes need launcher 'slurm'")
    launch = Launch(nproc=nproc, max_restarts=max_restarts)
    cfg = with_degrees(cfg, **(degrees or {}))
    out = Path(out_dir)
    if launcher == "slurm":
        from vfm_core.output_lock import lock_env
        from vfm_core.train.slurm import SlurmOptions, submit_training

        # what every launch does first, for the whole job: the layout over nnodes x nproc ranks
        # checked, out checked and locked while the job runs (this task waits for it; its ranks
        # told so), out/run.yaml written (Slurm's ranks read the degrees from it)
        with prepare_training(
            cfg, out, world_size=nproc * nnodes, max_restarts=max_restarts
        ) as cfg_path:
            env = {"MLFLOW_RUN_ID": mlflow_run_id} if mlflow_run_id else {}
            opts = SlurmOptions.from_env(
                nodes=nnodes,
                nproc_per_node=nproc,
                max_restarts=max_restarts,
                extra_env=lock_env(out, env),
            )
            logger.info("submitting to Slurm: %d node(s) x %d process(es)", nnodes, nproc)
            job = submit_training(cfg_path, out, options=opts, resume=resume)
        logger.info("Slurm job %s %s, log %s", job.job_id, job.state, job.log)
        if job.summary is None:
            raise RuntimeError(f"Slurm job {job.job_id} wrote no summary line (log {job.log})")
        return job.summary
    env = dict(os.environ)
    if mlflow_run_id:
        env["MLFLOW_RUN_ID"] = mlflow_run_id
    lines: list[str] = []
    bar = ProgressArtifact(
        "train-progress", cfg.train.steps, description=f"training {cfg.recipe}: steps done ({out})"
    )

    def log(line: str) -> None:
        for clean in log_lines(line):  # no progress-bar redraws in the flow run's log
            lines.append(clean)
            logger.info(clean)
            bar.feed_line(clean)  # the run page's bar follows the trainer's step lines

    logger.info("launching %d process(es) in %s", launch.world_size, out)
    res = launch_training(cfg, out, launch=launch, resume=resume, env=env, on_line=log)
    if res.returncode != 0:
        tail = "\n".join(lines[-15:])
        # the trainer's one-line error first (what the MLflow run's vfm.error tag shows)
        reason = next((ln.strip() for ln in reversed(lines) if "error:" in ln), "")
        raise RuntimeError(f"training exited with code {res.returncode}: {reason}\n{tail}")
    if res.summary is not None:  # the trainer's last stdout line is its JSON summary
        bar.update(bar.total)
        return res.summary
    raise RuntimeError(f"training finished without a summary line:\n{chr(10).join(lines[-15:])}")
