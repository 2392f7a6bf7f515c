"""The one training entry point. Every launcher runs exactly this: ``vfm train`` in-process (one
rank), ``torchrun`` on one node or many (:mod:`vfm_core.train.launch`), the Prefect training task,
the Slurm and Kubernetes templates::

    python -m vfm_core.train.main --config run.yaml --out DIR [--resume | --resume-from CKPT]
                                  [--tp 2 --cp 2 ...] [--debug]
    torchrun --nproc-per-node 4 -m vfm_core.train.main --config run.yaml --out DIR --tp 2 --cp 2

Rank 0 writes ``DIR/config.yaml``, ``DIR/metrics.jsonl`` (the global-batch loss per step) and
``DIR/summary.json`` and logs to MLflow (attaching to ``$MLFLOW_RUN_ID`` when a flow created the
run); every rank takes part in checkpoints. The last stdout line of rank 0 is the JSON summary.
``--resume`` continues from the newest intact checkpoint (damaged ones are skipped with one
warning line each); ``--resume-from`` names one. Before any work every rank checks that ``--out``
is (or can be made) a directory it can write, and rank 0 holds ``--out``'s writer lock
(:mod:`vfm_core.output_lock`; a launcher that started the ranks holds it for them): a second run
into the same ``--out`` is refused while this one runs. Errors a user can cause are one line
(exit code 2); ``--debug`` adds the traceback of the library error behind it.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
import sys
import traceback
from pathlib import Path
from typing import Any

import torch.distributed as dist

from vfm_core.annotate.text_encoder import TEXT_RECORD
from vfm_core.checkpoints.init import start_from_init
from vfm_core.checkpoints.manager import (
    CheckpointError,
    CheckpointManager,
    load_trainer,
    save_trainer,
)
from vfm_core.config import (
    DEGREES,
    Config,
    ConfigError,
    ParallelDegrees,
    load_yaml,
    save_yaml,
    validate,
)
from vfm_core.config_fields import add_flags
from vfm_core.errors import UserError
from vfm_core.launch.preempt import Preempted, StopRequest
from vfm_core.output_lock import output_lock
from vfm_core.parallel.layout import with_degrees
from vfm_core.parallel.world import broadcast_str, exit_process, init_world, is_rank0
from vfm_core.tracking import (
    CHECKPOINT_TAG,
    LAYOUT_TAG,
    STAGE_TAG,
    layout_label,
    open_tracking_store,
    train_run_name,
)
from vfm_core.tracking_backlog import BACKLOG_FILE
from vfm_core.tracking_logger import MLflowLogger
from vfm_core.train.args import ENTRY_FLAGS, TrainArgs
from vfm_core.train.metrics import ConsoleLogger, JsonlLogger, fit_and_close
from vfm_core.train.trainer import Trainer, resolve_device


class OutDirError(UserError, OSError):
    """The output directory (``--out``) is a file, or cannot be created or written."""


def refuse_non_directory(out: Path) -> None:
    """A file (or anything else not a directory) at ``--out`` is one line naming it."""
    if out.exists() and not out.is_dir():
        raise OutDirError(f"--out {out}: is a file, not a directory (choose another --out)")


def check_out_dir(out: Path) -> None:
    """``out`` is a directory this process can write: created when missing, then a probe file
    created and removed in it (and in its ``checkpoints`` folder when there is one), so a
    read-only or misnamed ``--out`` is one line before any work, not a traceback at the first
    save."""
    refuse_non_directory(out)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise OutDirError(f"--out {out}: cannot create the directory ({e.strerror})") from e
    for folder in (out, out / "checkpoints"):
        if not folder.is_dir():
            continue
        probe = folder / f".write-probe-{socket.gethostname()}-{os.getpid()}"
        try:
            probe.write_bytes(b"")
            probe.unlink()
        except OSError as e:
            raise OutDirError(
                f"--out {out}: not writable, cannot create a file in {folder} ({e.strerror})"
            ) from e


def check_restartable(cfg: Config, max_restarts: int) -> None:
    """Restarts resume from the last checkpoint: without one before the end they would start
    over, so ``--max-restarts`` needs ``train.ckpt_every`` below ``train.steps``."""
    t = cfg.train
    if max_restarts > 0 and t.ckpt_every >= t.steps:
        raise ConfigError(
            f"--max-restarts {max_restarts}: restarts resume from the last checkpoint, but "
            f"train.ckpt_every={t.ckpt_every} saves none before the end of train.steps={t.steps} "
            "(set train.ckpt_every lower)"
        )


def restart_count() -> int:
    """How often torchrun restarted this job's ranks (0 on the first attempt)."""
    return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))


def run_training(
    cfg: Config,
    *,
    out_dir: str | Path,
    resume: bool = False,
    progress: bool = True,
    resume_from: str | Path | None = None,
) -> dict[str, Any]:
    """Train ``cfg`` on this process's rank (the torchrun world, or one process) writing
    ``out_dir``; returns the summary dict (the same on every rank). ``resume``: from the newest
    intact checkpoint; ``resume_from``: from that checkpoint folder."""
    validate(cfg)
    out = Path(out_dir)
    refuse_non_directory(out)  # before "--resume: no checkpoint under FILE/checkpoints"
    new = not out.exists()
    check_out_dir(out)  # every rank writes checkpoint files there
    # one writer per run: rank 0 holds the lock (unless its launcher does) before any check
    # reads the run's checkpoints, so a second run into --out is refused, not half-checked
    rank0 = os.environ.get("RANK", "0") == "0"
    with output_lock(out, what="--out", new=new) if rank0 else contextlib.nullcontext():
        return _checked_run(cfg, out, resume=resume, progress=progress, resume_from=resume_from)


def _checked_run(
    cfg: Config,
    out: Path,
    *,
    resume: bool,
    progress: bool,
    resume_from: str | Path | None,
) -> dict[str, Any]:
    """The checks of what ``out`` holds against ``resume`` / ``resume_from``, then the run."""
    ckpt = CheckpointManager(out, keep=cfg.train.keep_ckpts, async_save=cfg.train.async_checkpoint)
    saved = ckpt.candidates()  # finished or not; verified after the process group exists
    if restart_count() > 0:  # torchrun restarted the job after a rank died: continue, if possible
        resume = bool(saved)
        print(
            f"restart {restart_count()}: "
            + (f"resuming from {ckpt.dir}" if resume else "no checkpoint yet, starting over"),
            file=sys.stderr,
        )
    if resume_from is not None:
        resume = True
        if not Path(resume_from).is_dir():
            raise CheckpointError(f"--resume-from {resume_from}: no such checkpoint directory")
    elif resume and not saved:  # before any process group: one line, no hang
        raise CheckpointError(
            f"--resume: no checkpoint under {ckpt.dir} (nothing to continue; drop --resume to "
            "start a new run)"
        )
    if not resume and saved:
        raise CheckpointError(
            f"{out} already holds checkpoints (latest {saved[-1].name}): pass --resume to "
            "continue, or choose a new --out"
        )
    if cfg.tracking.mlflow and os.environ.get("RANK", "0") == "0":  # rank 0 logs
        open_tracking_store(cfg.tracking)  # a store it cannot use: one line before any work
    created = init_world(resolve_device(cfg.train.device))
    try:
        return _train(cfg, out, ckpt, resume=resume, resume_from=resume_from, progress=progress)
    finally:
        ckpt.close()  # this rank's outstanding save, also after an error (no collective)
        if created:
            dist.destroy_process_group()


def _train(
    cfg: Config,
    out: Path,
    ckpt: CheckpointManager,
    *,
    resume: bool,
    resume_from: str | Path | None,
    progress: bool,
) -> dict[str, Any]:
    trainer = Trainer(cfg)
    run_id = None
    path = None
    init = None
    if resume:  # any layout: DCP reshards the saved tensors into this one
        if cfg.train.init and trainer.frozen:
            start_from_init(trainer)  # the frozen weights: the checkpoint holds what trains
        path, run_id = _resume(ckpt, trainer, resume_from)
        if trainer.step >= cfg.train.steps:  # a finished run: its summary stays as it was
            if is_rank0():
                print(
                    f"nothing to train: {path} is at step {trainer.step} and train.steps is "
                    f"{cfg.train.steps} (raise --steps to go on)",
                    file=sys.stderr,
                )
            return finished_summary(out, trainer, path)
    elif cfg.train.init:  # a new run from a trained model's weights, any layout
        init = start_from_init(trainer)
    loggers: list = []
    mlf = None
    if is_rank0():
        _write_run_files(cfg, out, trainer)
        loggers = [
            JsonlLogger(out / "metrics.jsonl", resume_step=trainer.step if resume else None),
            ConsoleLogger(cfg.train.steps, initial=trainer.step, bar=progress),
        ]
        if cfg.tracking.mlflow:
            parent = init.tags() if init is not None else {}
            mlf = _mlflow_logger(cfg, out, trainer, run_id=run_id, tags=parent)
            loggers.append(mlf)
    # every rank takes part in a save; only rank 0 knows the MLflow run id
    shared_run_id = broadcast_str(mlf.run_id if mlf else "") or None

    def save(tr: Trainer) -> None:
        save_trainer(ckpt, tr, meta={"mlflow_run_id": shared_run_id})

    with StopRequest(trainer.device) as stop:  # SIGTERM / SIGUSR1: save after this step
        try:
            last = fit_and_close(trainer, loggers, checkpoint=save, mlflow=mlf, out=out, stop=stop)
        except Preempted as e:
            ckpt.wait()  # the stop's checkpoint written on every rank
            e.checkpoint = str(ckpt.written or "")
            raise
    ckpt.wait()  # the last asynchronous save finished on every rank
    # where the weights of this run are: the checkpoint it wrote last, else the one it resumed
    # from (not ckpt.latest(): a newer checkpoint of an older attempt may lie beside them)
    final = ckpt.written or path
    if mlf is not None and final:
        mlf.set_tag(CHECKPOINT_TAG, final.resolve().as_uri())
    summary = run_summary(out, trainer, final) | {
        "mlflow_run_id": shared_run_id,
        "mlflow_ui": mlf.ui_hint if mlf else None,
        "metrics": last,
    }
    if is_rank0():
        (out / "summary.json").write_text(json.dumps(summary, indent=1))
    return summary


def _resume(
    ckpt: CheckpointManager, trainer: Trainer, resume_from: str | Path | None
) -> tuple[Path, str | None]:
    """Load the chosen checkpoint into ``trainer``; (its path, the MLflow run id it saved)."""
    path = load_trainer(ckpt, trainer, ckpt.choose(resume_from), verified=True)
    if is_rank0() and (gone := ckpt.remove_leftovers()):  # saves killed while writing
        names = ", ".join(p.name for p in gone)
        print(
            f"removed {len(gone)} unfinished save(s) of an earlier attempt: {names}",
            file=sys.stderr,
        )
    run_id = ckpt.read_meta(path)["meta"].get("mlflow_run_id")
    if is_rank0():
        print(f"resumed from {path} at step {trainer.step}", file=sys.stderr)
    return path, run_id


def _write_run_files(cfg: Config, out: Path, trainer: Trainer) -> None:
    """The run's ``config.yaml`` and how its captions were encoded (rank 0)."""
    out.mkdir(parents=True, exist_ok=True)
    save_yaml(cfg, out / "config.yaml")
    text = getattr(trainer.source, "text_record", None)
    if text:
        (out / TEXT_RECORD).write_text(json.dumps(text))


def _mlflow_logger(
    cfg: Config, out: Path, trainer: Trainer, *, run_id: str | None, tags: dict[str, str]
) -> MLflowLogger:
    """The run's MLflow logger (a resumed run's ``run_id`` goes on), its parameters logged;
    ``tags``: more run tags (the init model's lineage)."""
    degrees = trainer.dims.degrees
    mlf = MLflowLogger(
        cfg.tracking,
        run_id=run_id,
        name=train_run_name(cfg.recipe, degrees, cfg.train.steps, trainer.world),
        tags={
            "recipe": cfg.recipe,
            STAGE_TAG: "train",
            LAYOUT_TAG: layout_label(degrees, trainer.world),
            **tags,
        },
        system_metrics=cfg.tracking.system_metrics,
        backlog=out / BACKLOG_FILE,  # what a server outage left unsent at the end
    )
    mlf.log_params(
        {
            **cfg.flat(),
            "world_size": trainer.world,
            "params": trainer.params,
            "flops_per_token": trainer.flops_per_token,
            "peak_flops_per_gpu": trainer.peak_flops,
            "peak_source": trainer.peak_source,
            "attn_backend_used": trainer.attn_backend_reason,
            "fp8_used": trainer.fp8_reason,
        }
    )
    return mlf


def run_summary(out: Path, trainer: Trainer, checkpoint: Path | None) -> dict[str, Any]:
    """What a run's summary says of its trainer: where it is, its layout and size, and where its
    weights are."""
    return {
        "step": trainer.step,
        "out_dir": str(out),
        "world_size": trainer.world,
        "degrees": trainer.dims.degrees,
        "checkpoint": str(checkpoint) if checkpoint else None,
        "params": trainer.params,
        "flops_per_token": trainer.flops_per_token,
    }


def finished_summary(out: Path, trainer: Trainer, path: Path) -> dict[str, Any]:
    """The summary of a run resumed at or past its last step: its own ``summary.json`` (the
    final metrics of the steps it trained), pointed at the checkpoint it was resumed from; the
    bare facts when that file is gone."""
    try:
        summary = json.loads((out / "summary.json").read_text())
    except (OSError, ValueError):
        summary = {"metrics": {}, "mlflow_run_id": None, "mlflow_ui": None}
    return summary | run_summary(out, trainer, path)


def build_parser() -> argparse.ArgumentParser:
    """The entry point's flags: :data:`~vfm_core.train.args.ENTRY_FLAGS` of ``vfm train``'s (the
    config file required here) and the parallel degrees."""
    ap = argparse.ArgumentParser(prog="python -m vfm_core.train.main")
    add_flags(ap, TrainArgs, ENTRY_FLAGS, required=("config",))
    add_flags(ap, ParallelDegrees, unset="parallel")
    return ap


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        cfg = with_degrees(load_yaml(args.config), **{k: getattr(args, k) for k in DEGREES})
        check_restartable(cfg, int(os.environ.get("TORCHELASTIC_MAX_RESTARTS", "0")))
        progress = not args.no_progress and sys.stderr.isatty()
        summary = run_training(
            cfg,
            out_dir=args.out,
            resume=args.resume,
            progress=progress,
            resume_from=args.resume_from,
        )
    except UserError as e:  # a bad input: one line (the flow's MLflow run shows it), exit 2
        if args.debug:
            traceback.print_exception(e)
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # Ctrl-C reaches every rank: the launcher says it once
        return 130
    except Preempted as e:  # SIGTERM / SIGUSR1: saved; one line, the signal's status
        if int(os.environ.get("RANK", "0")) == 0:
            print(f"vfm train: {e}", file=sys.stderr)
        return e.exit_code
    if int(os.environ.get("RANK", "0")) == 0:  # the group is gone: torchrun's rank says
        final = {k: v for k, v in summary.items() if k != "metrics"}
        print(json.dumps(final | {"final": summary["metrics"]}))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    exit_process(main())  # not sys.exit: see exit_process
