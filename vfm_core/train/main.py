"""Training entry point: ``python -m vfm_core.train.main --config run.yaml --out DIR [--resume]``
(also what ``vfm train`` and the Prefect training task run, and later ``torchrun``)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from vfm_core.config import Config, ConfigError, load_yaml, save_yaml
from vfm_core.train.checkpoint import CheckpointError, CheckpointManager
from vfm_core.train.metrics import ConsoleLogger, JsonlLogger, MLflowLogger, fit_and_close
from vfm_core.train.trainer import Trainer


def _check_same_model(path: Path, saved: dict[str, Any], current: dict[str, Any]) -> None:
    diff = [k for k in current if saved.get(k) != current[k]]
    if diff:
        shown = ", ".join(
            f"model.{k}: checkpoint {saved.get(k)!r} vs now {current[k]!r}" for k in diff[:4]
        )
        raise CheckpointError(f"checkpoint {path} was trained with another model shape ({shown})")


def run_training(
    cfg: Config, *, out_dir: str | Path, resume: bool = False, progress: bool = True
) -> dict[str, Any]:
    """Train ``cfg`` writing ``out_dir/metrics.jsonl`` and checkpoints; returns a summary dict."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    trainer = Trainer(cfg)
    ckpt = CheckpointManager(out, keep=cfg.train.keep_ckpts)
    run_id = None
    if resume:
        path = ckpt.latest()
        if path is None:
            raise CheckpointError(f"--resume: no checkpoint under {ckpt.dir}")
        doc = ckpt.read_meta(path)
        _check_same_model(path, doc["meta"].get("model", {}), trainer.meta()["model"])
        trainer.load_state_dict(ckpt.load(path, trainer.state_dict()))
        run_id = doc["meta"].get("mlflow_run_id")
        print(f"resumed from {path} at step {trainer.step}", file=sys.stderr)
    elif ckpt.latest() is not None:
        raise CheckpointError(
            f"{out} already holds checkpoints (latest {ckpt.latest().name}): pass --resume to "
            "continue, or choose a new --out"
        )
    save_yaml(cfg, out / "config.yaml")

    loggers: list = [
        JsonlLogger(out / "metrics.jsonl", resume_step=trainer.step if resume else None),
        ConsoleLogger(cfg.train.steps, initial=trainer.step, bar=progress),
    ]
    mlf = None
    if cfg.tracking.mlflow:
        mlf = MLflowLogger(cfg.tracking, run_id=run_id, tags={"recipe": cfg.recipe})
        mlf.log_params(
            {
                **cfg.flat(),
                "params": trainer.params,
                "flops_per_token": trainer.flops_per_token,
                "peak_flops": trainer.peak_flops,
                "peak_source": trainer.peak_source,
                "attn_backend_used": trainer.attn_backend_reason,
                "fp8_used": trainer.fp8_reason,
            }
        )
        loggers.append(mlf)

    def save(tr: Trainer) -> None:
        meta = {**tr.meta(), "mlflow_run_id": mlf.run_id if mlf else None}
        ckpt.save(tr.step, tr.state_dict(), meta=meta)

    last = fit_and_close(trainer, loggers, checkpoint=save, mlflow=mlf, out=out)
    summary = {
        "step": trainer.step,
        "out_dir": str(out),
        "checkpoint": str(ckpt.latest()) if ckpt.latest() else None,
        "mlflow_run_id": mlf.run_id if mlf else None,
        "mlflow_ui": mlf.ui_hint if mlf else None,
        "params": trainer.params,
        "flops_per_token": trainer.flops_per_token,
        "metrics": last,
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    return summary


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m vfm_core.train.main")
    ap.add_argument("--config", required=True, help="run config YAML (from Config.to_dict)")
    ap.add_argument("--out", required=True, help="output directory")
    ap.add_argument("--resume", action="store_true", help="continue from the latest checkpoint")
    ap.add_argument("--no-progress", action="store_true", help="no progress bar")
    args = ap.parse_args(argv)
    try:
        cfg = load_yaml(args.config)
        summary = run_training(
            cfg,
            out_dir=args.out,
            resume=args.resume,
            progress=not args.no_progress and sys.stderr.isatty(),
        )
    except (ConfigError, CheckpointError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(
        json.dumps(
            {k: v for k, v in summary.items() if k != "metrics"} | {"final": summary["metrics"]}
        )
    )
    return 0


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    sys.exit(main())
