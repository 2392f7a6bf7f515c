"""`torchrun -m vfm_core.train.main` under TP2 x CP2 on 4 gloo ranks trains the tiny preset,
tracks the 1-process loss curve step for step (fp32, relative tolerance 1e-4 over 20 steps) and logs
the global-batch loss and MFU per GPU to MLflow from rank 0."""

from __future__ import annotations

import json

import pytest
from parallel_harness import build_trainer, fit_collect, launch_ok, one_process

from tests.tiny_runs import TINY_CPU
from vfm_core.config import ConfigError, apply_overrides, save_yaml
from vfm_core.recipes import get_recipe
from vfm_core.train.launch import torchrun_argv

STEPS = 20
TINY = [
    *TINY_CPU,
    f"train.steps={STEPS}",
    "optim.warmup_steps=2",
    "optim.lr=0.002",
    "tracking.experiment=test-parallel-launch",
]


def _fit_one_process(rank, world, config):
    return fit_collect(build_trainer(config, world)).losses


def test_torchrun_argv_names_bad_input(tmp_path):
    argv = torchrun_argv(4, config="c.yaml", out="o", tp=2, cp=2, pp=None)
    assert "--nproc-per-node=4" in argv and argv[-4:] == ["--tp", "2", "--cp", "2"]
    with pytest.raises(ConfigError, match="--nproc: must be >= 1"):
        torchrun_argv(0, config="c.yaml", out="o")
    with pytest.raises(ConfigError, match="degree 'sp' unknown"):
        torchrun_argv(2, config="c.yaml", out="o", sp=2)


@pytest.mark.slow
def test_tp2_cp2_torchrun_tracks_one_process_and_logs_mfu(tmp_path):
    import mlflow

    from vfm_core.tracking import tracking_uri

    cfg = apply_overrides(get_recipe("dit-tiny"), TINY)
    config = tmp_path / "run.yaml"
    save_yaml(cfg, config)
    reference = one_process(_fit_one_process, str(config))  # in this process
    assert len(reference) == STEPS

    out = tmp_path / "tp2cp2"
    rows = launch_ok(torchrun_argv(4, config=config, out=out, tp=2, cp=2), out)
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))
    for step, (row, ref) in enumerate(zip(rows, reference), start=1):
        assert abs(row["loss"] - ref) <= 1e-4 * abs(ref), (step, row["loss"], ref)
    assert sum(reference[-5:]) < sum(reference[:5])  # it learns

    summary = json.loads((out / "summary.json").read_text())
    assert summary["degrees"] == {"pp": 1, "dp_replicate": 1, "dp_shard": 1, "cp": 2, "tp": 2}
    assert summary["checkpoint"].endswith("step_00000020")  # the end-of-run DCP checkpoint
    state = json.loads((out / "checkpoints" / "step_00000020" / "state.json").read_text())
    assert state["meta"]["mlflow_run_id"] == summary["mlflow_run_id"]
    client = mlflow.MlflowClient(tracking_uri=tracking_uri(cfg.tracking))
    run = client.get_run(summary["mlflow_run_id"])
    assert run.info.status == "FINISHED"
    assert run.data.params["world_size"] == "4" and run.data.params["parallel.tp"] == "2"
    for key in ("loss", "mfu", "tflops", "tokens_per_s"):
        history = client.get_metric_history(run.info.run_id, key)
        assert len(history) == STEPS and all(m.value > 0 for m in history), key
    assert {a.path for a in client.list_artifacts(run.info.run_id)} == {
        "config.yaml",
        "metrics.jsonl",
    }
