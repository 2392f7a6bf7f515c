"""A real Slurm runs the training: infra/slurm/train.sbatch submitted (through
vfm_core.train.slurm, what the Prefect task calls) to a single-node cluster on 127.0.0.1 with 2
tensor-parallel ranks completes, and its losses equal the one-process run of the same config;
without Slurm the submission fails in one line."""

from __future__ import annotations

import json
import os
import socket

import pytest
from slurm_cluster import start_cluster, stop_cluster

from vfm_core.config import apply_overrides, save_yaml
from vfm_core.recipes import get_recipe
from vfm_core.train.main import run_training
from vfm_core.train.slurm import SlurmError, SlurmOptions, submit_training

SMALL = [
    "model.hidden=64",
    "model.depth=2",
    "model.heads=4",
    "model.text_dim=32",
    "data.latent_height=8",
    "data.latent_width=8",
    "data.batch_size=4",
    "train.steps=3",
    "train.seed=5",
    "tracking.mlflow=false",
]


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    root = tmp_path_factory.mktemp("slurm")
    env = start_cluster(root)
    old = os.environ.get("SLURM_CONF")
    os.environ["SLURM_CONF"] = env["SLURM_CONF"]
    try:
        yield root
    finally:
        stop_cluster(root)
        if old is None:
            os.environ.pop("SLURM_CONF", None)
        else:
            os.environ["SLURM_CONF"] = old


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_sbatch_template_trains_two_ranks_like_one_process(slurm, tmp_path):
    cfg = apply_overrides(get_recipe("dit-tiny"), [*SMALL, "parallel.tp=2"])
    save_yaml(cfg, tmp_path / "run.yaml")
    opts = SlurmOptions(
        nodes=1,
        nproc_per_node=2,
        gpus_per_node=0,
        cpus_per_task=os.cpu_count() or 2,
        rdzv_port=_free_port(),
        timeout_s=300,
    )
    job = submit_training(tmp_path / "run.yaml", tmp_path / "slurm-run", options=opts)
    assert job.state == "COMPLETED" and job.exit_code == "0:0"
    assert job.summary is not None and job.summary["world_size"] == 2
    assert job.summary["degrees"]["tp"] == 2
    got = [json.loads(x)["loss"] for x in (tmp_path / "slurm-run" / "metrics.jsonl").open()]
    one = apply_overrides(get_recipe("dit-tiny"), SMALL)
    run_training(one, out_dir=tmp_path / "one", progress=False)
    want = [json.loads(x)["loss"] for x in (tmp_path / "one" / "metrics.jsonl").open()]
    assert len(got) == len(want) == 3
    for g, w in zip(got, want):
        assert abs(g - w) <= 1e-4 * abs(w), (got, want)


def test_no_slurm_is_one_clear_line(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # no sbatch here
    with pytest.raises(SlurmError, match="no Slurm: sbatch not found on PATH"):
        submit_training(tmp_path / "run.yaml", tmp_path / "out")


@pytest.mark.slow
def test_training_flow_submits_to_slurm_from_the_form(slurm, tmp_path, monkeypatch):
    """launcher=slurm in the training form (a work pool sets it with VFM_TRAIN_LAUNCHER): the
    flow's task submits the template and returns the job's summary."""
    from prefect.testing.utilities import prefect_test_harness

    from flows.train import TrainParams, train_flow

    params = TrainParams(
        recipe="dit-tiny",
        steps=2,
        out_dir=str(tmp_path / "run"),
        nproc=2,
        tp=2,
        launcher="slurm",
        overrides=[o for o in SMALL if not o.startswith("train.")],
    )
    # the CPU work pool's job variables: no GPUs, the node's CPUs
    monkeypatch.setenv("VFM_SLURM_GPUS_PER_NODE", "0")
    monkeypatch.setenv("VFM_SLURM_CPUS_PER_TASK", str(os.cpu_count() or 2))
    with prefect_test_harness(server_startup_timeout=120):
        summary = train_flow(params)
    assert summary["world_size"] == 2 and summary["step"] == 2
    assert (tmp_path / "run" / "metrics.jsonl").is_file()
    assert any(p.name.startswith("slurm-") for p in (tmp_path / "run").iterdir())


@pytest.mark.slow
def test_a_job_that_can_never_start_is_cancelled_in_one_line(slurm, tmp_path):
    cfg = apply_overrides(get_recipe("dit-tiny"), SMALL)
    save_yaml(cfg, tmp_path / "run.yaml")
    opts = SlurmOptions(gpus_per_node=0, cpus_per_task=512, timeout_s=60)  # more than the node
    with pytest.raises(SlurmError, match="can never start"):
        submit_training(tmp_path / "run.yaml", tmp_path / "big", options=opts)


def test_form_refuses_nodes_without_slurm():
    from flows.train import TrainParams

    with pytest.raises(ValueError, match="launcher 'slurm'"):
        TrainParams(nnodes=2, launcher="local")
