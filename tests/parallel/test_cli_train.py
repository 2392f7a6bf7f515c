"""`vfm train --nproc N --tp/--cp ...` (the spine's train contract under torchrun)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

TINY = [
    "--set",
    "model.depth=2",
    "--set",
    "model.hidden=64",
    "--set",
    "data.batch_size=2",
    "--set",
    "data.latent_height=8",
    "--set",
    "data.latent_width=8",
]


def _vfm(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "vfm_core.cli", *args], capture_output=True, text=True, timeout=600
    )


@pytest.mark.slow
def test_vfm_train_nproc_writes_the_train_contract(tmp_path):
    out = tmp_path / "run"
    r = _vfm(
        "train",
        "--nproc",
        "2",
        "--tp",
        "2",
        "--steps",
        "2",
        "--out",
        str(out),
        "--no-mlflow",
        *TINY,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    rows = [json.loads(x) for x in (out / "metrics.jsonl").open()]
    assert [x["step"] for x in rows] == [1, 2]
    for x in rows:
        assert {"loss", "tokens_per_s", "tflops", "mfu"} <= set(x) and x["loss"] > 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["degrees"]["tp"] == 2


def test_vfm_train_rejects_an_impossible_layout_before_launching(tmp_path):
    r = _vfm("train", "--nproc", "2", "--tp", "3", "--steps", "1", "--out", str(tmp_path / "x"))
    assert r.returncode == 2
    assert r.stderr.strip().count("\n") == 0  # one line
    assert "does not divide the world size 2" in r.stderr
    assert not (tmp_path / "x").exists()


def test_vfm_train_checks_the_config_under_the_requested_layout_before_launching(tmp_path):
    """A pack length that the requested cp x tp cannot split is named before torchrun starts."""
    r = _vfm(
        "train",
        "--nproc",
        "2",
        "--cp",
        "2",
        "--steps",
        "1",
        "--out",
        str(tmp_path / "x"),
        "--set",
        "data.source=shards",
        "--set",
        "data.shards=/nowhere",
        "--set",
        "data.max_tokens=33",
    )
    assert r.returncode == 2, r.stderr[-2000:]
    assert r.stderr.strip().count("\n") == 0  # one line
    assert "data.max_tokens=33 is not a multiple of parallel.cp * parallel.tp = 2" in r.stderr
    assert not (tmp_path / "x").exists()
