"""Checkpoints under pipeline parallelism (DCP): ``vfm train --pp 2`` saves every stage's model,
EMA and AdamW moments with the data position, schedule and step into one checkpoint (the union of
the stages, optimizer ``param_groups`` merged by parameter name); ``--resume`` in new processes
continues with bit-identical losses; the PP2 checkpoint resumes in one process and a one-process
checkpoint resumes under PP2 with the losses of the run that never stopped (fp32, relative 1e-5).
"""

from __future__ import annotations

import json
import shutil

import pytest
from parallel_harness import (
    build_trainer,
    fit_collect,
    launch_ok,
    one_process,
    resume_trainer,
    run_ranks,
)

from vfm_core.checkpoints.state_tree import merge_skeletons, restrict_skeleton
from vfm_core.config import apply_overrides, save_yaml
from vfm_core.recipes import get_recipe
from vfm_core.train.launch import torchrun_argv
from vfm_core.train.main import main

TOL = 1e-5
STEPS = 4
TINY = [
    "model.hidden=64",
    "model.depth=3",
    "model.text_dim=32",
    "data.batch_size=2",
    "data.latent_height=8",
    "data.latent_width=8",
    "train.device=cpu",
    "optim.warmup_steps=2",
    "optim.lr=0.002",
    "optim.grad_clip=0.5",
    "tracking.mlflow=false",
    f"train.steps={STEPS}",
    "train.ckpt_every=2",
    "train.keep_ckpts=2",
]


def _resume_from(rank, world, config, path, degrees):
    """Load ``path`` into a fresh trainer of this layout and train to the end: the losses."""
    tr = build_trainer(config, world, degrees)
    resume_trainer(tr, path)
    assert tr.step == 2, tr.step
    return fit_collect(tr).losses


def _fit_saving(rank, world, config, root, degrees):
    """Train from scratch under ``degrees`` with checkpoints under ``root``: the losses."""
    from vfm_core.checkpoints.manager import CheckpointManager, save_trainer

    ckpt = CheckpointManager(root)
    tr = build_trainer(config, world, degrees)
    return fit_collect(tr, checkpoint=lambda t: save_trainer(ckpt, t)).losses


def _one_process(rank, world, config, pp_ckpt, root):
    """One process: resume the PP2 step-2 checkpoint; then train from scratch with checkpoints
    (under ``root``), the reference for the one-process -> PP2 direction."""
    resumed = _resume_from(rank, world, config, pp_ckpt, {})
    return {"resumed": resumed, "scratch": _fit_saving(rank, world, config, root, {})}


def _torchrun(config, out, *extra):
    return launch_ok([*torchrun_argv(2, config=config, out=out, pp=2), *extra], out)


def _close(got, want):
    assert len(got) == len(want), (got, want)
    for g, w in zip(got, want, strict=True):
        assert abs(g - w) <= TOL * abs(w), (got, want)


@pytest.mark.slow
def test_pp2_checkpoints_resume_bit_identical_and_reshard_to_one_process_and_back(tmp_path):
    config = tmp_path / "run.yaml"
    save_yaml(apply_overrides(get_recipe("dit-tiny"), TINY), config)

    # the uninterrupted PP2 run saves at steps 2 and 4, every stage's tensors in one checkpoint
    out = tmp_path / "pp2"
    rows = _torchrun(config, out)
    losses = [r["loss"] for r in rows]
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))
    summary = json.loads((out / "summary.json").read_text())
    assert summary["checkpoint"].endswith("step_00000004")
    saved = out / "checkpoints" / "step_00000002"
    assert not list(saved.glob("*.metadata"))  # no pickle
    state = json.loads((saved / "state.json").read_text())["state"]
    for part in ("model", "ema"):  # first stage: embedder + blocks 0, 1; last: block 2 + final
        tops = {k.split(".")[0] for k in state[part]}
        assert {"x_embedder", "t_embedder", "blocks", "final"} <= tops
        assert {k.split(".")[1] for k in state[part] if k.startswith("blocks.")} == {"0", "1", "2"}
    (group,) = state["optim"]["param_groups"]
    assert len(group["params"]) == len(set(group["params"])) == len(state["optim"]["state"])
    assert set(group["params"]) == set(state["model"])

    # stopped after step 2, resumed by new processes under PP2: bit-identical losses
    half = tmp_path / "pp2-resumed"
    (half / "checkpoints").mkdir(parents=True)
    shutil.copytree(saved, half / "checkpoints" / saved.name)
    resumed = _torchrun(config, half, "--resume")
    assert [r["step"] for r in resumed] == [3, 4]
    assert [r["loss"] for r in resumed] == losses[2:]
    assert [r["grad_norm"] for r in resumed] == [r["grad_norm"] for r in rows][2:]

    # PP2 -> one process: the losses of continuing under PP2; one process tracks PP2 from scratch
    one = one_process(_one_process, str(config), str(saved), str(tmp_path / "one"))
    _close(one["resumed"], losses[2:])
    _close(one["scratch"], losses)

    # one process -> PP2: the one-process step-2 checkpoint loaded into the stages
    one_ckpt = tmp_path / "one" / "checkpoints" / "step_00000002"
    for got in run_ranks(_resume_from, 2, str(config), str(one_ckpt), {"pp": 2}):
        _close(got, one["scratch"][2:])


@pytest.mark.slow
def test_pp2_fsdp2_checkpoint_resumes_under_pp2(tmp_path):
    """Saved by 4 ranks (2 stages x 2 FSDP2 shards, conditioning replicas sharded on both
    stages' meshes), loaded by 2 (whole stages) on the same global batch of 4."""
    sharded = whole = tmp_path / "run.yaml"
    save_yaml(apply_overrides(get_recipe("dit-tiny"), [*TINY, "data.batch_size=4"]), sharded)
    root = tmp_path / "pp2dp2"
    losses = run_ranks(_fit_saving, 4, str(sharded), str(root), {"pp": 2, "dp_shard": 2})[0]
    saved = root / "checkpoints" / "step_00000002"
    for got in run_ranks(_resume_from, 2, str(whole), str(saved), {"pp": 2}):
        _close(got, losses[2:])


def test_merge_and_restrict_skeletons():
    def t(path):
        return {"__tensor__": path}

    stage0 = {
        "model": {"a.w": t("model.a.w"), "c.w": t("model.c.w")},
        "step": 2,
        "optim": {
            "state": {"a.w": {"step": t("optim.state.a.w.step")}},
            "param_groups": [{"lr": 0.1, "params": ["a.w", "c.w"]}],
        },
    }
    stage1 = {
        "model": {"b.w": t("model.b.w"), "c.w": t("model.c.w")},
        "step": 2,
        "optim": {
            "state": {"b.w": {"step": t("optim.state.b.w.step")}},
            "param_groups": [{"lr": 0.1, "params": ["c.w", "b.w"]}],
        },
    }
    merged = merge_skeletons([stage0, stage1])
    assert list(merged["model"]) == ["a.w", "c.w", "b.w"]
    assert merged["optim"]["param_groups"] == [{"lr": 0.1, "params": ["a.w", "c.w", "b.w"]}]
    assert set(merged["optim"]["state"]) == {"a.w", "b.w"} and merged["step"] == 2
    mine = restrict_skeleton(merged, {"model.b.w", "model.c.w", "optim.state.b.w.step"})
    assert mine["model"] == stage1["model"] and mine["optim"]["state"] == stage1["optim"]["state"]
    assert mine["step"] == 2 and restrict_skeleton({"ema": {}}, set()) == {"ema": {}}

    with pytest.raises(Exception, match="param_groups differ in number across ranks"):
        merge_skeletons(
            [{"optim": {"param_groups": [{"params": []}]}}, {"optim": {"param_groups": []}}]
        )


def test_resume_without_checkpoint_is_one_line_before_any_process_group(tmp_path, capsys):
    config = tmp_path / "run.yaml"
    save_yaml(apply_overrides(get_recipe("dit-tiny"), TINY), config)
    out = tmp_path / "o"
    assert main(["--config", str(config), "--out", str(out), "--pp", "2", "--resume"]) == 2
    err = capsys.readouterr().err
    assert f"--resume: no checkpoint under {out / 'checkpoints'}" in err
    assert not out.exists()
