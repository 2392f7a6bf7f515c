"""Multi-node and elastic runs of the one trainer on this machine: two ``vfm train --nnodes 2``
launches ("nodes", one process each, c10d rendezvous on 127.0.0.1) train the one-process run;
``--max-restarts`` survives a SIGKILLed rank by restarting every rank from the last checkpoint
with the losses of the uninterrupted run; bad launch requests fail in one line.

What need not be a process of its own (the one-process reference, node 0's launcher, the bad
requests but one) calls ``vfm_core.cli.main`` in the test's process: a fresh interpreter costs
~8 s of imports on a loaded CI core."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest
from parallel_harness import set_args, vfm_argv

from vfm_core.cli import main as vfm_main
from vfm_core.launch.launcher import TORCHRUN

STEPS = 6
SMALL = [
    "model.hidden=64",
    "model.depth=2",
    "model.text_dim=32",
    "data.latent_height=8",
    "data.latent_width=8",
    "data.batch_size=4",
    "optim.warmup_steps=1",
    "optim.lr=0.002",
]


def _args(out: Path, *extra) -> list[str]:
    """``vfm train``'s arguments for the run into ``out``."""
    run = ["train", "--recipe", "dit-tiny", "--steps", STEPS, "--seed", 3, "--no-mlflow"]
    return [str(a) for a in (*run, "--out", out, *set_args(SMALL), *extra)]


def _argv(out: Path, *extra) -> list[str]:
    """The command line of ``vfm train`` into ``out``."""
    return vfm_argv(*_args(out, *extra))


def _vfm(*args: str) -> int:
    """``vfm ARGS`` in this process, one intra-op thread per rank it starts."""
    with pytest.MonkeyPatch.context() as env:
        env.setenv("OMP_NUM_THREADS", "1")
        return vfm_main([str(a) for a in args])


def _train_ok(out: Path, *extra) -> list[dict]:
    """``vfm train`` into ``out`` in this process: the rows of its ``metrics.jsonl``."""
    assert _vfm(*_args(out, *extra)) == 0
    return [json.loads(x) for x in (out / "metrics.jsonl").open()]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _losses(out: Path) -> list[float]:
    return [json.loads(x)["loss"] for x in (out / "metrics.jsonl").open()]


def _close(got, want, tol=1e-4):
    assert len(got) == len(want), (got, want)
    for g, w in zip(got, want, strict=True):
        assert abs(g - w) <= tol * abs(w), (got, want)


@pytest.fixture(scope="module")
def one_process(tmp_path_factory) -> list[float]:
    out = tmp_path_factory.mktemp("one") / "run"
    return [r["loss"] for r in _train_ok(out)]


def _env():
    return {**os.environ, "OMP_NUM_THREADS": "1"}


@pytest.mark.slow
def test_two_nodes_train_the_one_process_run(one_process, tmp_path):
    out, port = tmp_path / "nodes", _free_port()
    node = [
        "--nnodes",
        "2",
        "--rdzv-endpoint",
        f"127.0.0.1:{port}",
        "--rdzv-timeout",
        "60",
        "--tp",
        "2",
    ]
    joiner = subprocess.Popen(
        [str(a) for a in _argv(out, *node, "--node-rank", "1")],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=_env(),
    )
    try:
        host = _train_ok(out, *node, "--node-rank", "0")
        joined = joiner.communicate(timeout=120)[0]
    finally:
        joiner.kill()
    assert joiner.returncode == 0, joined[-3000:]
    _close([r["loss"] for r in host], one_process)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["degrees"]["tp"] == 2


def _workers(out: Path) -> list[int]:
    """PIDs of the training ranks (not the torchrun agent) writing to ``out``."""
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmd = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        args = [c.decode(errors="replace") for c in cmd]
        if (
            "vfm_core.train.main" in args
            and str(out) in args
            and not {"torch.distributed.run", TORCHRUN} & set(args)  # the agent
        ):
            pids.append(int(proc.name))
    return sorted(pids)


@pytest.mark.slow
def test_a_killed_rank_restarts_the_job_from_the_last_checkpoint(one_process, tmp_path):
    out, steps = tmp_path / "elastic", 12  # long enough to be killed mid-run
    argv = _argv(
        out,
        "--nproc",
        "2",
        "--dp-shard",
        "2",
        "--max-restarts",
        "1",
        "--set",
        "train.ckpt_every=2",
        "--steps",
        steps,
    )
    job = subprocess.Popen(
        [str(a) for a in argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=_env(),
    )
    try:
        metrics, deadline = out / "metrics.jsonl", time.monotonic() + 180
        while not (metrics.exists() and len(metrics.read_text().splitlines()) >= 3):
            assert job.poll() is None and time.monotonic() < deadline, "no step 3"
            time.sleep(0.2)
        victims = _workers(out)
        assert len(victims) == 2, victims
        os.kill(victims[-1], signal.SIGKILL)
        log = job.communicate(timeout=240)[0]
    finally:
        job.kill()
    assert job.returncode == 0, log[-3000:]
    assert "restart 1: resuming from" in log
    rows = [json.loads(x) for x in (out / "metrics.jsonl").open()]
    assert [r["step"] for r in rows] == list(range(1, steps + 1))  # re-run steps logged once
    _close([r["loss"] for r in rows][:STEPS], one_process)  # (constant LR: same first steps)


@pytest.mark.parametrize(
    "extra, message",
    [
        (
            ["--nnodes", "2", "--node-rank", "2", "--rdzv-endpoint", "127.0.0.1:1"],
            "--node-rank: 2 is out of range for --nnodes 2",
        ),
        (["--nnodes", "2", "--node-rank", "1"], "--rdzv-endpoint: expected HOST:PORT"),
        (
            [
                "--nnodes",
                "2",
                "--node-rank",
                "1",
                "--rdzv-endpoint",
                "127.0.0.1:9",
                "--rdzv-timeout",
                "1",
            ],
            "no rendezvous answered within 1 s",
        ),
        (["--max-restarts", "2"], "--max-restarts 2: restarts resume from the last checkpoint"),
        (["--nproc", "2", "--tp", "3"], "does not divide the world size 2"),
        (
            ["--nnodes", "2", "--nproc", "1", "--tp", "4", "--rdzv-endpoint", "127.0.0.1:9"],
            "does not divide the world size 2",
        ),
    ],
)
def test_bad_launch_requests_fail_in_one_line(extra, message, tmp_path, capsys):
    capsys.readouterr()
    code = _vfm(*_args(tmp_path / "x", *extra))
    out, err = capsys.readouterr()
    assert code == 2, err[-2000:]
    assert err.strip().count("\n") == 0 and message in err and out == "", (out, err)


def test_a_bad_launch_request_is_one_line_from_the_command_line(tmp_path):
    """The same, as a user's shell runs it: a fresh interpreter, its exit status."""
    extra = ["--nnodes", "2", "--node-rank", "2", "--rdzv-endpoint", "127.0.0.1:1"]
    proc = subprocess.run(
        [str(a) for a in _argv(tmp_path / "x", *extra)],
        capture_output=True,
        text=True,
        timeout=120,
        env=_env(),
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    message = "--node-rank: 2 is out of range for --nnodes 2"
    assert proc.stderr.strip().count("\n") == 0 and message in proc.stderr, proc.stderr
