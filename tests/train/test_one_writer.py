"""Two ``vfm train`` into one ``--out`` at once (#46): one runs, the other is refused in one line
naming it, before it writes anything; the run's files are all the runner's."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import yaml

from tests.tiny_runs import TINY_CPU
from vfm_core.output_lock import LOCK_FILE
from vfm_core.train.checkpoint import CheckpointManager

STEPS = 6


def _train(out: Path, seed: int) -> subprocess.Popen:
    sets = [a for s in [*TINY_CPU, "train.ckpt_every=3"] for a in ("--set", s)]
    argv = [sys.executable, "-m", "vfm_core.cli", "train", "--recipe", "dit-tiny"]
    argv += ["--steps", str(STEPS), "--seed", str(seed), "--out", str(out), "--no-mlflow", *sets]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.Popen(
        argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def test_two_runs_into_one_out_one_is_refused_and_the_run_is_one_runs(tmp_path):
    out = tmp_path / "run"
    runs = {seed: _train(out, seed) for seed in (1, 2)}  # started at once
    ends = {seed: (p, *p.communicate(timeout=300)) for seed, p in runs.items()}
    codes = {seed: p.returncode for seed, (p, _, _) in ends.items()}
    assert sorted(codes.values()) == [0, 2], {s: (c, ends[s][2][-2000:]) for s, c in codes.items()}
    won = next(s for s, c in codes.items() if c == 0)
    lost = 3 - won
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
