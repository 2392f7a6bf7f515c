"""Packed training under parallel layouts (``data.max_tokens``): shards of images and videos of
several latent sizes packed into 32-token sequences; sigma, noise and caption drop of a sample are
counter-based on its loader position, and every rank weighs its samples by dp / (samples of the
global step), so `vfm train --nproc 2 --cp 2` (packs cut into token chunks, samples split across
ranks) and `--nproc 2 --dp-shard 2` (each rank its own packs) give the losses of one process
(fp32; relative 1e-5) and log MFU to MLflow; so do packs through a CP2 x PP2 pipeline.
The one-process runs and ``vfm train`` (whose ranks are torchrun's processes) are called in the
test's process.

(Named apart from tests/train/test_packed_training.py: test files without ``__init__.py`` must
have distinct basenames.)"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from parallel_harness import (
    build_trainer,
    fit_collect,
    metrics_rows,
    one_process,
    resume_trainer,
    set_args,
    vfm_main_ok,
)

from vfm_core.config import apply_overrides, save_yaml
from vfm_core.recipes import get_recipe

STEPS = 4
PACKS = 2  # packs of the global step
SMALL = [
    "model.hidden=64",
    "model.depth=2",
    "model.text_dim=16",
    "train.device=cpu",
    "optim.warmup_steps=1",
    "optim.lr=0.002",
    "data.source=shards",
    "data.max_tokens=32",
    "diffusion.cond_dropout=0.3",
    "tracking.experiment=test-packed-training",
]


@pytest.fixture(scope="module")
def shards(tmp_path_factory, mixed_shards) -> Path:
    """Real H.264 clips (one-frame images and videos) with stored latents of several sizes."""
    return mixed_shards.write(tmp_path_factory.mktemp("mixed"), seed=1)


def _fit(rank, world, config, resume_from=""):
    """A packed training run from ``config`` on ``world`` ranks (restored from the
    checkpoint folder ``resume_from`` first, if given); its logged rows."""
    tr = build_trainer(config, world, {})
    if resume_from:
        resume_trainer(tr, resume_from)
    return fit_collect(tr).rows


def _one_process_config(shards: Path, folder: Path) -> str:
    config = folder / "run.yaml"
    cfg = apply_overrides(
        get_recipe("dit-tiny"),
        [*SMALL, f"data.shards={shards}", f"data.batch_size={PACKS}", f"train.steps={STEPS}"],
    )
    save_yaml(cfg, config)
    return str(config)


@pytest.fixture(scope="module")
def reference(shards, tmp_path_factory):
    """One process at the global batch."""
    config = _one_process_config(shards, tmp_path_factory.mktemp("ref"))
    rows = one_process(_fit, config)
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))
    assert all(np.isfinite(r["loss"]) and r["mfu"] > 0 for r in rows)
    return rows


def _vfm_train(out: Path, shards: Path, *args: str) -> None:
    """``vfm train ARGS`` on the shards (in this process), which must succeed."""
    sets = set_args([*SMALL, f"data.shards={shards}"])
    vfm_main_ok("train", "--recipe", "dit-tiny", "--out", out, "--steps", STEPS, *args, *sets)


def _check_run(out: Path, uri: str, reference: list[dict], tol: float = 1e-5) -> dict:
    rows = metrics_rows(out)
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))
    for r, w in zip(rows, reference, strict=True):
        assert abs(r["loss"] - w["loss"]) <= tol * abs(w["loss"]), (rows, reference)
        assert r["tokens_per_s"] > 0 and r["mfu"] > 0
        # the same real tokens per step (throughput x time), whatever the layout
        assert r["tokens_per_s"] * r["step_time"] == pytest.approx(
            w["tokens_per_s"] * w["step_time"], rel=1e-6
        )
    import mlflow

    summary = json.loads((out / "summary.json").read_text())
    client = mlflow.MlflowClient(tracking_uri=uri)
    run = client.get_run(summary["mlflow_run_id"])
    assert run.info.status == "FINISHED" and run.data.params["data.max_tokens"] == "32"
    mfu = client.get_metric_history(run.info.run_id, "mfu")
    assert len(mfu) == STEPS and all(m.value > 0 for m in mfu)
    return summary


@pytest.mark.slow
def test_vfm_train_cp2_on_packs_matches_one_process_and_resumes_in_one(shards, reference, tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    out = tmp_path / "cp2"
    sets = [f"data.batch_size={PACKS}", "train.ckpt_every=2", f"tracking.tracking_uri={uri}"]
    _vfm_train(out, shards, "--nproc", "2", "--cp", "2", *(a for s in sets for a in ("--set", s)))
    summary = _check_run(out, uri, reference)
    assert summary["degrees"]["cp"] == 2
    # its step-2 checkpoint (packed loader state, CP2 weights) resumed by one process
    saved = out / "checkpoints" / "step_00000002"
    state = json.loads((saved / "state.json").read_text())["state"]["data"]
    assert state["max_tokens"] == 32 and state["planner"]["steps"] == 2
    rows = one_process(_fit, _one_process_config(shards, tmp_path), str(saved))
    assert [r["step"] for r in rows] == [3, 4]
    for r, w in zip(rows, reference[2:], strict=True):
        assert abs(r["loss"] - w["loss"]) <= 1e-5 * abs(w["loss"]), (rows, reference)


FOUR_RANKS = {
    # FSDP2 over 2 dp ranks (one pack each) x TP2 with sequence parallelism (each pack's tokens
    # cut in two inside the model)
    "dp2tp2": {"dp_shard": 2, "tp": 2},
    # two pipeline stages, each pack's tokens cut over 2 context-parallel ranks inside every
    # stage; the step's 2 packs are the schedule's 2 microbatches
    "cp2pp2": {"cp": 2, "pp": 2},
}


@pytest.mark.slow
@pytest.mark.parametrize("layout", list(FOUR_RANKS))
def test_vfm_train_on_packs_under_4_rank_layouts_matches_one_process(
    layout, shards, reference, tmp_path
):
    degrees = FOUR_RANKS[layout]
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    out = tmp_path / layout
    flags = [a for k, v in degrees.items() for a in (f"--{k.replace('_', '-')}", str(v))]
    _vfm_train(
        out,
        shards,
        "--nproc",
        "4",
        *flags,
        "--set",
        f"data.batch_size={PACKS}",
        "--set",
        f"tracking.tracking_uri={uri}",
    )
    summary = _check_run(out, uri, reference, tol=1e-4)
    assert all(summary["degrees"][k] == v for k, v in degrees.items())
