"""Preemption (#46 item 3): SIGTERM, and SIGUSR1 (Slurm's ``--signal``), end a training run after
the step in progress on every rank, saved: one line naming the step and its checkpoint, the
signal's exit status (128 + signal), no traceback; ``--resume`` then trains the losses of an
uninterrupted run.

The runs a signal stops are processes of their own (``vfm train`` as a user starts it: the signal
goes to that process); what follows them (``--resume``, ``vfm checkpoint verify``, the
uninterrupted reference) runs the CLI in the test's process (``vfm_core.cli.main``; under
``--nproc 2`` it starts torchrun and the ranks as always), which saves a fresh interpreter's
imports per step of the test."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.tiny_runs import TINY_CPU
from vfm_core.cli import main as vfm_main
from vfm_core.config import apply_overrides
from vfm_core.recipes import get_recipe
from vfm_core.train.main import run_training

STEPS = 24
SETS = [*TINY_CPU, "train.log_every=1", "train.ckpt_every=1000", "train.seed=3"]
STOPPED = re.compile(
    r"vfm train: stopped by (SIG\w+) after step (\d+): checkpoint (\S+) saved; "
    r"continue with --resume"
)


def _args(out: Path, *extra: str) -> list[str]:
    """``vfm train``'s arguments for the run into ``out``."""
    sets = [a for s in SETS for a in ("--set", s)]
    run = ["train", "--recipe", "dit-tiny", "--steps", str(STEPS), "--no-mlflow", "--out"]
    return [*run, str(out), *sets, *extra]


def _argv(out: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "vfm_core.cli", *_args(out, *extra)]


def _vfm(capfd, *args: str) -> tuple[int, str, str]:
    """``vfm *args`` in this process (its ranks' output included): (status, stdout, stderr)."""
    capfd.readouterr()
    code = vfm_main(list(args))
    out, err = capfd.readouterr()
    return code, out, err


def _rows(out: Path) -> list[dict]:
    path = out / "metrics.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def _stop_after(out: Path, extra: list[str], sig: int, rows: int) -> tuple[int, str]:
    """Start the run, send ``sig`` once it has logged ``rows`` steps: (exit status, stderr)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(_argv(out, *extra), stderr=subprocess.PIPE, text=True, env=env)
    deadline = time.monotonic() + 300
    while len(_rows(out)) < rows and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    assert proc.poll() is None, proc.stderr.read()[-3000:] if proc.stderr else ""
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=120)
    return proc.returncode, err


def _stopped_step(out: Path, err: str, name: str) -> int:
    last = err.strip().splitlines()[-1]
    m = STOPPED.fullmatch(last)
    assert m and m[1] == name, err[-3000:]
    step = int(m[2])
    assert Path(m[3]) == out / "checkpoints" / f"step_{step:08d}" and Path(m[3]).is_dir()
    assert [r["step"] for r in _rows(out)] == list(range(1, step + 1))
    assert "Traceback" not in err, err[-3000:]
    return step


@pytest.mark.slow
def test_sigterm_under_two_ranks_saves_the_step_and_resume_trains_the_uninterrupted_losses(
    tmp_path, capfd, monkeypatch
):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    layout = ["--nproc", "2", "--dp-shard", "2"]
    out = tmp_path / "run"
    code, err = _stop_after(out, layout, signal.SIGTERM, rows=3)
    assert code == 128 + signal.SIGTERM, err[-3000:]
    step = _stopped_step(out, err, "SIGTERM")
    assert step < STEPS

    code, _, err = _vfm(capfd, *_args(out, *layout, "--resume"))
    assert code == 0, err[-3000:]
    got = _rows(out)
    assert [x["step"] for x in got] == list(range(1, STEPS + 1))  # each step once

    # one process, uninterrupted (its losses only: not tracked, as --no-mlflow above)
    sets = [*SETS, f"train.steps={STEPS}", "tracking.mlflow=false"]
    cfg = apply_overrides(get_recipe("dit-tiny"), sets)
    run_training(cfg, out_dir=tmp_path / "one", progress=False)
    want = [x["loss"] for x in _rows(tmp_path / "one")]
    for g, w in zip(got, want, strict=True):  # 1 process == 2 ranks (tests/parallel), fp32
        assert abs(g["loss"] - w) <= 1e-4 * abs(w), (g, w)


@pytest.mark.slow
def test_sigusr1_in_one_process_stops_saved_and_resume_removes_an_unfinished_save(tmp_path, capfd):
    out = tmp_path / "run"
    code, err = _stop_after(out, [], signal.SIGUSR1, rows=2)
    assert code == 128 + signal.SIGUSR1, err[-3000:]
    _stopped_step(out, err, "SIGUSR1")
    # what a save killed while writing leaves: named by verify, removed by --resume
    left = out / "checkpoints" / "step_00000099.tmp"
    left.mkdir()
    (left / "__0_0.distcp").write_bytes(b"partial")
    code, stdout, err = _vfm(capfd, "checkpoint", "verify", str(out))
    assert code == 0, stdout + err
    assert f"left {left}: a save that never finished (--resume removes it)" in stdout
    code, _, err = _vfm(capfd, *_args(out, "--resume"))
    assert code == 0, err[-3000:]
    assert "removed 1 unfinished save(s) of an earlier attempt: step_00000099.tmp" in err
    assert not left.exists() and [x["step"] for x in _rows(out)] == list(range(1, STEPS + 1))
