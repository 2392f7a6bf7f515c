"""Regional compilation (``train.compile``, vfm_core.parallel.parallelize): each block compiled
in place trains the eager losses, keeps the parameter names (checkpoints load either way) and
resumes bit-identically."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from vfm_core.config import apply_overrides
from vfm_core.parallel.apply import compile_enabled
from vfm_core.recipes import get_recipe
from vfm_core.train.main import run_training
from vfm_core.train.trainer import Trainer

FAST = ["data.batch_size=2", "model.depth=2", "train.log_every=1", "train.ckpt_every=2"]


def _cfg(recipe: str, mode: str, steps: int):
    sets = [*FAST, f"train.compile={mode}", f"train.steps={steps}", "tracking.mlflow=false"]
    return apply_overrides(get_recipe(recipe), sets)


def _losses(out: Path) -> list[float]:
    return [json.loads(r)["loss"] for r in (out / "metrics.jsonl").open()]


def test_auto_compiles_on_cuda_only():
    assert [compile_enabled(m, "cpu") for m in ("off", "auto", "on")] == [False, False, True]
    assert [compile_enabled(m, "cuda") for m in ("off", "auto", "on")] == [False, True, True]


@pytest.mark.parametrize("recipe", ["dit-tiny", "ar-tiny"])
def test_compiled_blocks_train_the_eager_losses_and_resume_bit_identical(tmp_path, recipe):
    """Both families' blocks; the resume (the trainer's, family-blind) checked on the DiT."""
    eager, compiled = Trainer(_cfg(recipe, "off", 4)), Trainer(_cfg(recipe, "on", 4))
    assert eager.param_names == compiled.param_names  # checkpoints load compiled or not
    block = next(iter(compiled.model.blocks.values()))
    assert block._compiled_call_impl is not None  # nn.Module.compile(): compiled in place
    del eager, compiled
    runs = {}
    for mode in ("off", "on"):
        run_training(_cfg(recipe, mode, 4), out_dir=tmp_path / mode, progress=False)
        runs[mode] = _losses(tmp_path / mode)
    assert runs["on"] == pytest.approx(runs["off"], rel=1e-5)
    if recipe != "dit-tiny":
        return
    # the compiled run's step-2 checkpoint, resumed compiled elsewhere: its steps 3-4 exactly
    split = tmp_path / "split"
    step2 = tmp_path / "on" / "checkpoints" / "step_00000002"
    run_training(_cfg(recipe, "on", 4), out_dir=split, resume_from=step2, progress=False)
    assert _losses(split)[-2:] == runs["on"][-2:]  # exact


def test_compiled_blocks_under_tensor_parallel_train_the_one_process_losses(
    tmp_path, monkeypatch, capfd
):
    """torchrun-style 2 ranks, TP2 + SP over compiled blocks (DTensor inside the compiled
    region) against one process: the layout equality holds with compile on. (One compiled
    process trains the eager losses: the test above; the reference here is eager.)

    ``vfm train`` is called in this process (the ranks are torchrun's own processes; the
    reference trains here): no interpreter importing the library again per run. Half the
    captions dropped: every step's batch has a dropped one, so every step takes the masked
    cross-attention path and the blocks compile once (at the recipe's 0.1 the caption mask
    comes and goes between steps, and each variant is compiled)."""
    from tests.tiny_runs import TINY_CPU
    from vfm_core.cli import main as vfm_main

    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # the ranks': one intra-op thread each
    sets = [*TINY_CPU, "data.batch_size=4", "train.log_every=1", "diffusion.cond_dropout=0.5"]
    runs = {}
    for name, extra in (
        ("one", ["train.compile=off"]),
        ("tp2", ["train.compile=on", "--nproc", "2", "--tp", "2"]),
    ):
        out = tmp_path / name
        args = [a for s in [*sets, *extra[:1]] for a in ("--set", s)]
        run = ["train", "--recipe", "dit-tiny", "--steps", "3", "--no-mlflow", "--out", str(out)]
        rc = vfm_main([*run, *extra[1:], *args])
        assert rc == 0, capfd.readouterr().err[-3000:]
        runs[name] = _losses(out)
    assert len(runs["one"]) == 3
    assert runs["tp2"] == pytest.approx(runs["one"], rel=1e-4)
