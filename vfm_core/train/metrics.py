"""Metric loggers: metrics.jsonl (the run's own record), console progress bar; MLflow's is
:class:`vfm_core.tracking_logger.MLflowLogger`.

Metric keys are one vocabulary everywhere: ``loss``, ``grad_norm``, ``lr``, ``tokens_per_s``,
``tflops``, ``mfu``, ``data_wait``, ``step_time``, ``peak_mem_gb``, with a blend of datasets
``data/samples/<name>`` (samples drawn from each so far), and from shards ``captions_cut``
(captions longer than ``model.text_len`` tokens, cut, so far in this process). Only rank 0 logs.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any, Protocol

from tqdm import tqdm

from vfm_core.errors import UserError
from vfm_core.progress import format_duration
from vfm_core.tracking_logger import MLflowLogger


class MetricsFileError(UserError, ValueError):
    """``metrics.jsonl`` of a run being resumed holds a damaged line before its last one."""


class MetricLogger(Protocol):
    def log_params(self, params: dict[str, Any]) -> None: ...

    def log(self, step: int, metrics: dict[str, float]) -> None: ...

    def close(self) -> None: ...


class JsonlLogger:
    """Appends one JSON object per logged step to ``metrics.jsonl``. On resume from step S, lines
    after S (logged by a run that crashed before its next checkpoint) are dropped so the file holds
    each step once, and so is a torn last line (a kill mid-write; one warning line); the file is
    rewritten atomically (a temporary file renamed over it), so a kill then loses nothing."""

    def __init__(self, path: str | Path, *, resume_step: int | None = None):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if resume_step is None:
            self.path.write_text("")
        elif self.path.exists():
            keep = [ln for ln, step in self._records() if step <= resume_step]
            tmp = self.path.with_name(self.path.name + ".tmp")
            with tmp.open("w") as f:
                f.write("".join(ln + "\n" for ln in keep))
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
        self._f = self.path.open("a")

    def _records(self) -> list[tuple[str, int]]:
        """(line, step) of every record in the file; a torn last line is left out with a
        warning, a damaged earlier one is a :class:`MetricsFileError` naming the line."""
        lines = [
            (i, ln) for i, ln in enumerate(self.path.read_text().splitlines(), 1) if ln.strip()
        ]
        out = []
        for n, (i, ln) in enumerate(lines):
            try:
                step = json.loads(ln)["step"]
                if isinstance(step, bool) or not isinstance(step, int):
                    raise TypeError(f"step {step!r} is not an integer")
            except (json.JSONDecodeError, KeyError, TypeError) as e:
                if n < len(lines) - 1:
                    raise MetricsFileError(
                        f"{self.path}: line {i} is not a metrics record ({type(e).__name__}: "
                        f"{e}); only a torn last line is dropped on resume: fix or remove line "
                        f"{i} to resume"
                    ) from None
                print(
                    f"warning: {self.path}: dropped its torn last line (line {i}, {len(ln)} "
                    "characters, not a complete record: the run was stopped while writing it)",
                    file=sys.stderr,
                )
                continue
            out.append((ln, step))
        return out

    def log_params(self, params: dict[str, Any]) -> None:
        pass

    def log(self, step: int, metrics: dict[str, float]) -> None:
        self._f.write(json.dumps({"step": step, **metrics}) + "\n")
        self._f.flush()

    def close(self) -> None:
        self._f.close()


class ConsoleLogger:
    """Progress on stderr: a tqdm bar on a terminal, else one line every ~5% of the steps with
    the time spent and left at this run's rate so far (so a log collected by a Prefect task
    still shows progress)."""

    def __init__(self, total: int, *, initial: int = 0, bar: bool = True):
        self.total, self.bar = total, None
        self.every = max(1, total // 20)
        self.start, self.t0 = initial, time.monotonic()
        if bar:
            self.bar = tqdm(
                total=total, initial=initial, unit="step", dynamic_ncols=True, desc="train"
            )

    def log_params(self, params: dict[str, Any]) -> None:
        pass

    def log(self, step: int, metrics: dict[str, float]) -> None:
        if self.bar is not None:
            self.bar.update(step - self.bar.n)
            self.bar.set_postfix(
                loss=f"{metrics['loss']:.4f}",
                tok_s=f"{metrics['tokens_per_s']:.0f}",
                mfu=f"{metrics['mfu']:.1%}",
                refresh=False,
            )
        elif step % self.every == 0 or step == self.total:
            spent = time.monotonic() - self.t0
            left = (self.total - step) * spent / max(1, step - self.start)
            print(
                f"step {step}/{self.total} loss {metrics['loss']:.4f} "
                f"{metrics['tokens_per_s']:.0f} tokens/s {metrics['tflops'] * 1e3:.1f} GFLOP/s "
                f"MFU {metrics['mfu']:.1%}, {format_duration(spent)}, about "
                f"{format_duration(left)} left",
                file=sys.stderr,
                flush=True,
            )

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def fit_and_close(
    trainer, loggers: list, *, checkpoint, mlflow: MLflowLogger | None, out: Path, stop=None
) -> dict[str, float]:
    """Run ``trainer.fit`` (``stop``: its :class:`~vfm_core.launch.preempt.StopRequest`) and close
    every logger whatever happens; the MLflow run gets the run's config and metrics file as
    artifacts and ends FINISHED, KILLED (preempted: it goes on with ``--resume``) or FAILED."""
    from vfm_core.launch.preempt import Preempted

    status = "FAILED"
    try:
        last = trainer.fit(loggers=loggers, checkpoint=checkpoint, stop=stop)
        status = "FINISHED"
    except Preempted:
        status = "KILLED"
        raise
    finally:
        for lg in loggers:
            if lg is mlflow:
                for name in ("config.yaml", "metrics.jsonl"):
                    mlflow.log_artifact(out / name)
                mlflow.close(status)
            else:
                lg.close()
    return last
