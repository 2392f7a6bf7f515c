from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from vfm_core.checkpoints.manager import CheckpointError, CheckpointManager
from vfm_core.config import apply_overrides
from vfm_core.data.samples import TrainBatch
from vfm_core.data.synthetic_latents import SyntheticLatents
from vfm_core.recipes import get_recipe
from vfm_core.train.main import run_training
from vfm_core.train.trainer import Trainer, TrainingDiverged

FAST = ["data.batch_size=2", "model.depth=2", "train.log_every=1"]


def vfm(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "vfm_core.cli", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )


def losses(out: Path) -> list[tuple[int, float]]:
    return [(r["step"], r["loss"]) for r in map(json.loads, (out / "metrics.jsonl").open())]


def test_resume_in_new_process_is_bit_identical(tmp_path):
    sets = [a for s in FAST + ["train.ckpt_every=5"] for a in ("--set", s)]
    straight, split = tmp_path / "straight", tmp_path / "split"
    r = vfm(
        "train",
        "--recipe",
        "dit-tiny",
        "--steps",
        "20",
        "--out",
        str(straight),
        "--no-mlflow",
        *sets,
    )
    assert r.returncode == 0, r.stderr
    r = vfm(
        "train", "--recipe", "dit-tiny", "--steps", "10", "--out", str(split), "--no-mlflow", *sets
    )
    assert r.returncode == 0, r.stderr
    r = vfm(
        "train",
        "--recipe",
        "dit-tiny",
        "--steps",
        "20",
        "--out",
        str(split),
        "--no-mlflow",
        "--resume",
        *sets,
    )
    assert r.returncode == 0, r.stderr
    a, b = losses(straight), losses(split)
    assert [s for s, _ in a] == list(range(1, 21)) and [s for s, _ in b] == list(range(1, 21))
    assert a == b  # exact float equality, every step
    rows = [json.loads(x) for x in (straight / "metrics.jsonl").open()]
    for key in (
        "step",
        "loss",
        "tokens_per_s",
        "tflops",
        "mfu",
        "grad_norm",
        "lr",
        "data_wait",
        "peak_mem_gb",
    ):
        assert key in rows[-1]
    assert rows[-1]["mfu"] > 0 and rows[-1]["tokens_per_s"] > 0
    # only the last two checkpoints are kept, no leftovers from the atomic write
    names = sorted(p.name for p in (straight / "checkpoints").iterdir())
    assert names == ["step_00000015", "step_00000020"]


def test_checkpoint_holds_no_pickle(tmp_path):
    cfg = apply_overrides(get_recipe("dit-tiny"), FAST + ["train.steps=2", "tracking.mlflow=false"])
    run_training(cfg, out_dir=tmp_path, progress=False)
    ck = CheckpointManager(tmp_path).latest()
    files = sorted(p.name for p in ck.iterdir())
    assert "state.json" in files and any(f.endswith(".safetensors") for f in files)
    assert all(f.endswith((".safetensors", ".json")) for f in files), files  # no pickle
    state = json.loads((ck / "state.json").read_text())
    assert state["step"] == 2 and state["state"]["data"]["position"] == 4


def test_resume_with_other_model_shape_fails_clearly(tmp_path):
    cfg = apply_overrides(get_recipe("dit-tiny"), FAST + ["train.steps=1", "tracking.mlflow=false"])
    run_training(cfg, out_dir=tmp_path, progress=False)
    other = apply_overrides(cfg, ["model.hidden=128", "train.steps=2"])
    with pytest.raises(
        CheckpointError,
        match=r"another model shape \(model.hidden: checkpoint 256 "
        r"vs now 128",
    ):
        run_training(other, out_dir=tmp_path, resume=True, progress=False)
    with pytest.raises(CheckpointError, match="no checkpoint under"):
        run_training(cfg, out_dir=tmp_path / "empty", resume=True, progress=False)


class _NaNSource(SyntheticLatents):
    def next_batch(self) -> TrainBatch:
        batch = super().next_batch()
        batch.values[0, 0, 0, 0, 0] = float("nan")
        return batch


def test_nan_loss_stops_before_update_and_saves_nothing(tmp_path):
    cfg = apply_overrides(get_recipe("dit-tiny"), FAST + ["train.steps=3"])
    trainer = Trainer(cfg, source=_NaNSource(cfg.data, cfg.model))
    before = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    saved = []
    with pytest.raises(TrainingDiverged, match="loss is nan at step 1; stopped before the update"):
        trainer.fit(loggers=[], checkpoint=lambda tr: saved.append(tr.step))
    assert saved == [] and trainer.step == 0
    after = trainer.model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_synthetic_source_is_a_pure_function_of_position():
    cfg = get_recipe("dit-tiny")
    a, b = SyntheticLatents(cfg.data, cfg.model), SyntheticLatents(cfg.data, cfg.model)
    a.next_batch()
    b.load_state_dict(a.state_dict())
    x, y = a.next_batch(), b.next_batch()
    assert torch.equal(x.values, y.values) and x.keys == y.keys
    assert 0.05 < x.values.std() < 1.0  # about sigma_data scale
    with pytest.raises(ValueError, match="data.seed"):
        b.load_state_dict({**a.state_dict(), "seed": 99})


def test_loss_falls_and_mlflow_has_the_charts(tmp_path):
    import mlflow

    cfg = apply_overrides(
        get_recipe("dit-tiny"),
        [
            "data.batch_size=4",
            "train.steps=60",
            "optim.lr=0.002",
            "optim.warmup_steps=5",
            "tracking.experiment=test-trainer",
        ],
    )
    summary = run_training(cfg, out_dir=tmp_path, progress=False)
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").open()]
    first = sum(r["loss"] for r in rows[:10]) / 10
    last = sum(r["loss"] for r in rows[-10:]) / 10
    assert last < 0.7 * first, (first, last)
    client = mlflow.MlflowClient()
    run = client.get_run(summary["mlflow_run_id"])
    assert run.info.status == "FINISHED"
    assert run.data.params["model.hidden"] == "256"
    for key in ("loss", "mfu", "tokens_per_s", "tflops", "grad_norm", "data_wait"):
        assert len(client.get_metric_history(run.info.run_id, key)) == 60, key
    assert {a.path for a in client.list_artifacts(run.info.run_id)} == {
        "config.yaml",
        "metrics.jsonl",
    }


def test_fresh_run_refuses_to_overwrite_checkpoints(tmp_path):
    cfg = apply_overrides(get_recipe("dit-tiny"), FAST + ["train.steps=1", "tracking.mlflow=false"])
    run_training(cfg, out_dir=tmp_path, progress=False)
    with pytest.raises(CheckpointError, match="already holds checkpoints .*pass --resume"):
        run_training(cfg, out_dir=tmp_path, progress=False)


def test_resuming_a_finished_run_trains_nothing_and_keeps_its_summary(tmp_path, capsys):
    cfg = apply_overrides(get_recipe("dit-tiny"), FAST + ["train.steps=1", "tracking.mlflow=false"])
    first = run_training(cfg, out_dir=tmp_path, progress=False)
    rows = (tmp_path / "metrics.jsonl").read_text()
    again = run_training(cfg, out_dir=tmp_path, resume=True, progress=False)
    assert "nothing to train" in capsys.readouterr().err
    assert "loss" in first["metrics"]
    assert again["step"] == 1 and again["metrics"] == first["metrics"]
    assert json.loads((tmp_path / "summary.json").read_text())["metrics"] == first["metrics"]
    assert (tmp_path / "metrics.jsonl").read_text() == rows
    assert again["checkpoint"] == first["checkpoint"]
