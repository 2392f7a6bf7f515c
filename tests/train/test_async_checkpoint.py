"""Asynchronous DCP checkpoints (``train.async_checkpoint``, issue #13): the same files and the
same resumed losses as synchronous saves; training goes on while a save is being written; a
process killed in the middle of an asynchronous save leaves the previous checkpoint loadable
(the manifest, written after DCP's future completed, is the completion marker)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch
from safetensors import safe_open

from tests.tiny_runs import TINY_CPU
from vfm_core.checkpoints.integrity import verify
from vfm_core.checkpoints.manager import CheckpointManager
from vfm_core.config import apply_overrides, save_yaml
from vfm_core.recipes import get_recipe
from vfm_core.train.main import run_training

TINY = [
    *TINY_CPU,
    "optim.lr=0.002",
    "optim.warmup_steps=2",
    "tracking.mlflow=false",
    "train.steps=6",
    "train.ckpt_every=2",
    "train.keep_ckpts=3",
]


def _cfg(*extra: str):
    return apply_overrides(get_recipe("dit-tiny"), [*TINY, *extra])


def _losses(out: Path) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in map(json.loads, (out / "metrics.jsonl").open())}


def _tensors(ck: Path) -> dict[str, torch.Tensor]:
    """Every saved tensor (the files' byte order may differ: staging changes the write order)."""
    out = {}
    for f in sorted(ck.glob("*.safetensors")):
        with safe_open(str(f), framework="pt") as st:
            out.update({k: st.get_tensor(k) for k in st.keys()})
    return out


def test_async_and_sync_saves_write_the_same_tensors_and_resume_the_same(tmp_path):
    sync, asyn = tmp_path / "sync", tmp_path / "async"
    run_training(_cfg(), out_dir=sync, progress=False)
    run_training(_cfg("train.async_checkpoint=true"), out_dir=asyn, progress=False)
    assert _losses(sync) == _losses(asyn)
    a, b = CheckpointManager(sync).list(), CheckpointManager(asyn).list()
    assert (
        [p.name for p in a]
        == [p.name for p in b]
        == ["step_00000002", "step_00000004", "step_00000006"]
    )
    for x, y in zip(a, b, strict=True):
        assert verify(y) == []
        tx, ty = _tensors(x), _tensors(y)
        assert tx.keys() == ty.keys() and all(torch.equal(tx[k], ty[k]) for k in tx)
    assert not [p for p in (asyn / "checkpoints").iterdir() if "." in p.name]  # no leftovers
    # resumed (asynchronously saving again) from the async step-2 checkpoint: the same losses
    run_training(
        _cfg("train.async_checkpoint=true"), out_dir=asyn, resume_from=b[0], progress=False
    )
    assert _losses(asyn) == _losses(sync)


_SLOW_SAVE = """
import sys, time
from pathlib import Path

import torch
from safetensors import safe_open
from torch.distributed.checkpoint import HuggingFaceStorageWriter
from vfm_core.config import load_yaml
from vfm_core.train.main import run_training

write = HuggingFaceStorageWriter.write_data

def stuck(self, plan, planner):  # the step-4 save hangs in the middle of writing its tensors
    if "step_00000004" in str(self.path):
        Path(sys.argv[3]).write_text("writing")
        time.sleep(300)
    return write(self, plan, planner)

HuggingFaceStorageWriter.write_data = stuck
run_training(load_yaml(sys.argv[1]), out_dir=sys.argv[2], progress=False)
"""


def test_killed_during_an_async_save_leaves_the_previous_checkpoint_loadable(tmp_path, capsys):
    config, out, marker = tmp_path / "run.yaml", tmp_path / "run", tmp_path / "writing"
    save_yaml(_cfg("train.async_checkpoint=true"), config)
    proc = subprocess.Popen(
        [sys.executable, "-c", _SLOW_SAVE, str(config), str(out), str(marker)],
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 120
        # training goes on while step 4 is being written: step 6 is trained (then the step-6
        # save waits for the stuck one)
        while time.monotonic() < deadline and not (
            marker.exists() and 6 in _losses(out) if (out / "metrics.jsonl").exists() else False
        ):
            assert proc.poll() is None, proc.stderr.read()
            time.sleep(0.2)
        assert marker.exists() and 6 in _losses(out)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    ckpt = CheckpointManager(out)
    assert [p.name for p in ckpt.list()] == ["step_00000002"]
    assert (out / "checkpoints" / "step_00000004.tmp").is_dir()  # the interrupted save
    two = ckpt.latest()
    assert verify(two) == []

    reference = tmp_path / "reference"
    run_training(_cfg(), out_dir=reference, progress=False)
    capsys.readouterr()
    run_training(_cfg("train.async_checkpoint=true"), out_dir=out, resume=True, progress=False)
    assert f"resumed from {two} at step 2" in capsys.readouterr().err
    assert _losses(out) == _losses(reference)
    assert [p.name for p in ckpt.candidates()] == [
        "step_00000002",
        "step_00000004",
        "step_00000006",
    ]
    assert not (out / "checkpoints" / "step_00000004.tmp").exists()
