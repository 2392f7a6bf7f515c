"""Two ``vfm train`` into one ``--out`` at once (#46): one runs, the other is refused in one line
naming it, before it writes anything; the run's files are all the runner's. The first is paused
(SIGSTOP) once it holds the lock, so the second meets it mid-run however loaded the machine is."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import yaml

from tests.tiny_runs import TINY_CPU
from vfm_core.checkpoints.manager import CheckpointManager
from vfm_core.output_lock import LOCK_FILE

STEPS = 6


def _train(out: Path, seed: int) -> subprocess.Popen:
    sets = [a for s in [*TINY_CPU, "train.ckpt_every=3"] for a in ("--set", s)]
    argv = [sys.executable, "-m", "vfm_core.cli", "train", "--recipe", "dit-tiny"]
    argv += ["--steps", str(STEPS), "--seed", str(seed), "--out", str(out), "--no-mlflow", *sets]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.Popen(
        argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def _holds_lock(out: Path, p: subprocess.Popen, timeout: float = 300) -> None:
    """Wait until ``p`` has written its holder record into ``out``'s writer lock."""
    lock, deadline = out / LOCK_FILE, time.monotonic() + timeout
    while not (lock.is_file() and lock.stat().st_size > 0):
        assert p.poll() is None, p.communicate()[1][-2000:]
        assert time.monotonic() < deadline, "the first run never took the writer lock"
        time.sleep(0.05)


def test_two_runs_into_one_out_one_is_refused_and_the_run_is_one_runs(tmp_path):
    out = tmp_path / "run"
    won, lost = 1, 2
    runs = {won: _train(out, won)}
    _holds_lock(out, runs[won])
    os.kill(runs[won].pid, signal.SIGSTOP)  # mid-run, holding the lock
    try:
        runs[lost] = _train(out, lost)
        ends = {lost: (runs[lost], *runs[lost].communicate(timeout=300))}
    finally:
        os.kill(runs[won].pid, signal.SIGCONT)
    ends[won] = (runs[won], *runs[won].communicate(timeout=300))
    codes = {seed: p.returncode for seed, (p, _, _) in ends.items()}
    assert codes == {won: 0, lost: 2}, {s: (c, ends[s][2][-2000:]) for s, c in codes.items()}
    errors = [ln for ln in ends[lost][2].splitlines() if "error" in ln.lower()]
    assert len(errors) == 1 and "Traceback" not in ends[lost][2], ends[lost][2]
    holder = f"pid {runs[won].pid} on {socket.gethostname()} since "
    assert errors[0].startswith(f"vfm train: error: --out {out} is being written by {holder}")
    assert (
        f"(python -m vfm_core.cli train --recipe dit-tiny --steps {STEPS} --seed {won} "
        in (errors[0])
    )
    assert errors[0].endswith("): wait for it to end or choose another --out")
    steps = [json.loads(ln)["step"] for ln in (out / "metrics.jsonl").read_text().splitlines()]
    assert steps == list(range(1, STEPS + 1))  # one run's steps, once each
    assert yaml.safe_load((out / "config.yaml").read_text())["train"]["seed"] == won
    ckpt = CheckpointManager(out)
    saved = ckpt.candidates()
    assert [p.name for p in saved] == ["step_00000003", "step_00000006"]
    assert {ckpt.read_meta(p)["meta"]["seed"] for p in saved} == {won}
    assert json.loads((out / "summary.json").read_text())["step"] == STEPS
    assert not (out / LOCK_FILE).exists()  # released at the end
