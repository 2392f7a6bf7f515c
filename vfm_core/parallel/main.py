"""Parallel training entry point, run by torchrun on every rank::

    torchrun --standalone --nproc-per-node 4 -m vfm_core.parallel.main \\
        --config run.yaml --out DIR --tp 2 --cp 2

CPU: gloo; CUDA: nccl, one GPU per local rank. Rank 0 writes ``DIR/metrics.jsonl`` (the loss of
the global batch), ``DIR/config.yaml`` and ``DIR/summary.json`` and logs to MLflow (attaching to
``$MLFLOW_RUN_ID`` when a flow created the run), with TFLOPS and MFU per GPU.
:func:`torchrun_argv` builds the command line for ``vfm train --nproc N``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from vfm_core.config import ConfigError, load_yaml, save_yaml, validate
from vfm_core.parallel.checkpoint import ParallelCheckpoint, load_trainer, save_trainer
from vfm_core.parallel.dims import ParallelDims
from vfm_core.parallel.pipeline_trainer import PipelineTrainer
from vfm_core.parallel.trainer import ParallelTrainer
from vfm_core.train.checkpoint import CheckpointError
from vfm_core.train.metrics import ConsoleLogger, JsonlLogger, MLflowLogger, fit_and_close

_DEGREES = ("dp_replicate", "dp_shard", "cp", "tp", "pp")


def torchrun_argv(
    nproc: int, *, config: str | Path, out: str | Path, **degrees: int | None
) -> list[str]:
    """``python -m torch.distributed.run`` command for ``nproc`` local ranks; ``degrees`` (e.g.
    ``tp=2``) override the config's parallel section."""
    if nproc < 1:
        raise ConfigError(f"--nproc: must be >= 1, got {nproc}")
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    argv += [f"--nproc-per-node={nproc}", "-m", "vfm_core.parallel.main"]
    argv += ["--config", str(config), "--out", str(out)]
    for name, value in degrees.items():
        if name not in _DEGREES:
            raise ConfigError(f"parallel degree {name!r} unknown (known: {_DEGREES})")
        if value is not None:
            argv += [f"--{name.replace('_', '-')}", str(value)]
    return argv


def _broadcast_str(text: str, size: int = 256) -> str:
    """Rank 0's ``text`` on every rank (as bytes in a tensor: no pickle between ranks)."""
    buf = torch.zeros(size, dtype=torch.uint8)
    raw = text.encode()[:size]
    buf[: len(raw)] = torch.frombuffer(bytearray(raw), dtype=torch.uint8) if raw else buf[:0]
    if dist.get_backend() == "nccl":
        buf = buf.cuda()
    dist.broadcast(buf, src=0)
    return bytes(buf.cpu().tolist()).rstrip(b"\0").decode()


def run(args: argparse.Namespace) -> dict:
    cfg = load_yaml(args.config)
    given = {k: getattr(args, k) for k in _DEGREES if getattr(args, k) is not None}
    cfg = validate(dataclasses.replace(cfg, parallel=dataclasses.replace(cfg.parallel, **given)))
    found = ParallelCheckpoint(args.out)
    if args.resume and found.latest() is None:  # before any process group: one line, no hang
        raise CheckpointError(
            f"--resume: no checkpoint under {found.dir} (nothing to continue; drop --resume to "
            "start a new run)"
        )
    cuda = torch.cuda.is_available() and cfg.train.device != "cpu"
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group("nccl" if cuda else "gloo")
    try:
        dims = ParallelDims.from_config(cfg.parallel, dist.get_world_size())
        dims.build_mesh("cuda" if cuda else "cpu")
        # pp > 1: one pipeline stage per rank (optionally x TP, FSDP2); else parallelize_dit
        trainer = (PipelineTrainer if dims.pp_enabled else ParallelTrainer)(cfg, dims=dims)
        rank0 = dist.get_rank() == 0
        out = Path(args.out)
        ckpt = ParallelCheckpoint(out, keep=cfg.train.keep_ckpts)
        run_id = None
        if args.resume:  # any layout: DCP reshards the saved tensors into this one
            path = load_trainer(ckpt, trainer)
            run_id = ckpt.read_meta(path)["meta"].get("mlflow_run_id")
        elif ckpt.latest() is not None:
            raise CheckpointError(
                f"{out} already holds checkpoints (latest {ckpt.latest().name}): pass --resume to "
                "continue, or choose a new --out"
            )
        loggers: list = []
        mlf = None
        if rank0:
            out.mkdir(parents=True, exist_ok=True)
            save_yaml(cfg, out / "config.yaml")
            loggers = [
                JsonlLogger(
                    out / "metrics.jsonl", resume_step=trainer.step if args.resume else None
                ),
                ConsoleLogger(cfg.train.steps, initial=trainer.step, bar=False),
            ]
            if cfg.tracking.mlflow:
                mlf = MLflowLogger(cfg.tracking, run_id=run_id, tags={"recipe": cfg.recipe})
                mlf.log_params(
                    {
                        **cfg.flat(),
                        "world_size": dims.world_size,
                        "params": trainer.params,
                        "flops_per_token": trainer.flops_per_token,
                        "peak_flops_per_gpu": trainer.peak_flops,
                        "peak_source": trainer.peak_source,
                    }
                )
                loggers.append(mlf)
        # every rank takes part in a save; only rank 0 knows the MLflow run id
        shared_run_id = _broadcast_str(mlf.run_id if mlf else "") or None

        def save(tr: ParallelTrainer) -> None:
            save_trainer(ckpt, tr, meta={"mlflow_run_id": shared_run_id})

        last = fit_and_close(trainer, loggers, checkpoint=save, mlflow=mlf, out=out)
        summary = {
            "step": trainer.step,
            "out_dir": str(out),
            "world_size": dims.world_size,
            "degrees": dims.degrees,
            "mlflow_run_id": mlf.run_id if mlf else None,
            "checkpoint": str(ckpt.latest()) if ckpt.latest() else None,
            "params": trainer.params,
            "metrics": last,
        }
        if rank0:
            (out / "summary.json").write_text(json.dumps(summary, indent=1))
        return summary
    finally:
        dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="torchrun ... -m vfm_core.parallel.main")
    ap.add_argument("--config", required=True, help="run config YAML (from Config.to_dict)")
    ap.add_argument("--out", required=True, help="output directory (rank 0 writes)")
    for name in _DEGREES:
        ap.add_argument(f"--{name.replace('_', '-')}", dest=name, type=int, help=f"parallel.{name}")
    ap.add_argument("--resume", action="store_true", help="continue from the latest checkpoint")
    args = ap.parse_args(argv)
    try:
        summary = run(args)
    except (ConfigError, CheckpointError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if int(os.environ.get("RANK", "0")) == 0:
        print(
            json.dumps(
                {k: v for k, v in summary.items() if k != "metrics"} | {"final": summary["metrics"]}
            )
        )
    return 0


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    sys.exit(main())
