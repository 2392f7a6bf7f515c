"""Starting a run from a trained model (``train.init``, ``vfm train --init``), one process: the
weights and EMA are the model's, the optimizer, schedule and step start new; the run may change
frames, resolution and caption length; another architecture is one line (or, non-strict, loads
the overlap and names the rest); another family, a missing or damaged checkpoint is one line
before anything is written. Across layouts: tests/parallel/test_resharding.py; a registered
model as SRC and the lineage a version keeps: tests/registry/test_registry.py."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.tiny_runs import TINY_CPU
from vfm_core.checkpoints.errors import CheckpointError
from vfm_core.checkpoints.init import (
    check_init,
    load_init,
    open_init,
    start_from_init,
    with_init_settings,
)
from vfm_core.config import apply_overrides
from vfm_core.recipes import get_recipe
from vfm_core.train.main import run_training
from vfm_core.train.trainer import Trainer

TINY = [*TINY_CPU, "tracking.mlflow=false", "train.ema_decay=0.5", "optim.lr=0.01"]


def _cfg(*extra: str, recipe: str = "dit-tiny"):
    return apply_overrides(get_recipe(recipe), [*TINY, *extra])


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    """A dit-tiny run trained 3 steps (its EMA differs from its weights)."""
    out = tmp_path_factory.mktemp("base") / "run"
    assert run_training(_cfg("train.steps=3"), out_dir=out, progress=False)["step"] == 3
    return out


def _saved(run: Path) -> dict[str, torch.Tensor]:
    (ckpt,) = (run / "checkpoints").iterdir()
    return {k: v for f in ckpt.glob("*.safetensors") for k, v in load_file(f).items()}


def test_init_takes_weights_and_ema_and_starts_optimizer_schedule_and_step_new(base):
    trainer = Trainer(_cfg("train.steps=2", f"train.init={base}"))
    init = start_from_init(trainer)
    assert init.checkpoint.name == "step_00000003"
    saved = _saved(base)
    params = dict(trainer.layout.named_parameters())
    for name, p in params.items():
        assert torch.equal(p.detach(), saved[f"model.{name}"]), name
        assert torch.equal(trainer.ema.state_dict()[name], saved[f"ema.{name}"]), name
    assert any(not torch.equal(saved[f"model.{n}"], saved[f"ema.{n}"]) for n in params)
    assert trainer.step == 0 and not trainer.optimizer.state
    assert trainer.scheduler.last_epoch == 0


def test_init_run_changes_frames_resolution_and_caption_length(base, tmp_path):
    out = tmp_path / "ft"
    changed = ["data.latent_frames=2", "data.latent_height=16", "model.text_len=12"]
    cfg = _cfg("train.steps=1", f"train.init={base}", *changed)
    assert check_init(cfg) is not None  # text_len and the grid size no parameter
    summary = run_training(cfg, out_dir=out, progress=False)
    assert summary["step"] == 1 and summary["metrics"]["loss"] > 0
    (row,) = [json.loads(line) for line in (out / "metrics.jsonl").open()]
    assert row["step"] == 1  # a new run: step 1, not the base's 4


def test_another_architecture_is_one_line_or_loads_the_overlap(base, capsys):
    wider = _cfg("model.depth=3", f"train.init={base}")
    with pytest.raises(CheckpointError) as e:
        check_init(wider)
    assert str(e.value) == (
        f"--init {base}: another architecture (model.depth: checkpoint 2 vs this run 3); set "
        "train.init_strict=false to load the parameters that match and start the others new"
    )
    trainer = Trainer(_cfg("model.depth=3", f"train.init={base}", "train.init_strict=false"))
    before = {n: p.detach().clone() for n, p in trainer.layout.named_parameters()}
    notes = load_init(trainer, open_init(str(base)))
    assert notes and notes[0].startswith("left new: blocks.2.")
    saved = _saved(base)
    for name, p in trainer.layout.named_parameters():
        want = before[name] if name.startswith("blocks.2.") else saved[f"model.{name}"]
        assert torch.equal(p.detach(), want), name
    strict = Trainer(_cfg("model.depth=3", f"train.init={base}"))
    with pytest.raises(CheckpointError, match=r"does not fit this run's model \(\d+ missing"):
        load_init(strict, open_init(str(base)))


def test_the_init_models_network_unless_the_user_sets_model_keys(base):
    plain = apply_overrides(get_recipe("dit-tiny"), [f"train.init={base}"])
    derived = with_init_settings(plain, set())
    assert (derived.model.hidden, derived.model.depth, derived.model.text_dim) == (64, 2, 32)
    kept = with_init_settings(plain, {"model.text_len"})
    assert kept.model.text_len == plain.model.text_len
    with pytest.raises(CheckpointError) as e:
        with_init_settings(_cfg(f"train.init={base}", recipe="ar-tiny"), set())
    assert "a diffusion model (model.arch 'dit'); this run's recipe 'ar-tiny' is of the " in str(
        e.value
    )


def test_missing_and_damaged_init_are_one_line(base, tmp_path):
    with pytest.raises(CheckpointError, match=r"^--init .*nowhere: no such directory$"):
        open_init(str(tmp_path / "nowhere"))
    copy = tmp_path / "copy"
    shutil.copytree(base, copy)
    (ckpt,) = (copy / "checkpoints").iterdir()
    shard = sorted(ckpt.glob("*.safetensors"))[0]
    raw = bytearray(shard.read_bytes())
    raw[-5] ^= 0xFF
    shard.write_bytes(bytes(raw))
    with pytest.raises(CheckpointError) as e:
        open_init(str(ckpt))
    assert str(e.value).startswith("--init: ") and "sha256" in str(e.value)
    with pytest.raises(CheckpointError, match=r"^--init: no valid checkpoint under"):
        open_init(str(copy))


def test_vfm_train_init_of_another_family_is_one_line_and_writes_nothing(base, tmp_path):
    out = tmp_path / "out"
    argv = ["train", "--recipe", "ar-tiny", "--init", str(base), "--steps", "1", "--out", str(out)]
    r = subprocess.run(
        [sys.executable, "-m", "vfm_core.cli", *argv, "--no-mlflow"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip() == (
        f"vfm train: error: --init {base}: a diffusion model (model.arch 'dit'); this run's "
        "recipe 'ar-tiny' is of the autoregressive family"
    )
    assert not out.exists()
