"""The parallel trainer reads the shard loader (``data.source: shards``): each data-parallel rank
gets its own slice of every global step, the model-parallel ranks of one slice read 1/k of its
samples each and all-gather the bytes; the slices of all dp ranks are the 1-process global batch,
so `vfm train --nproc 2 --dp-shard 2` and `--nproc 4 --tp 2 --cp 2` give the 1-process losses
(fp32; relative 1e-5 under DP, 1e-4 under TP x CP), log MFU to MLflow, and a resume in new
processes (same or another layout) continues with the losses of the run that never stopped."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from parallel_harness import (
    build_trainer,
    fit_collect,
    metrics_rows,
    resume_trainer,
    run_ranks,
    set_args,
    write_moving_clip_shards,
)

from vfm_core.cli import main as vfm_main
from vfm_core.config import apply_overrides, save_yaml
from vfm_core.data.loader import LoaderStateError
from vfm_core.data.shard_source import ShardLatentSource, rebatch_state
from vfm_core.recipes import get_recipe

N_CLIPS = 16
STEPS = 4
GLOBAL_BATCH = 4
SMALL = [
    "model.hidden=64",
    "model.depth=2",
    "model.text_dim=16",
    "data.latent_frames=2",
    "data.latent_height=4",
    "data.latent_width=4",
    "train.device=cpu",
    "optim.warmup_steps=1",
    "optim.lr=0.002",
    "tracking.experiment=test-shard-training",
]


def _embed(captions: list[str]) -> np.ndarray:
    """16-d unit caption vectors seeded by the caption text (fast and deterministic)."""
    out = []
    for c in captions:
        v = np.random.default_rng(sum(map(ord, c)) * 7919 + len(c)).standard_normal(16)
        out.append((v / np.linalg.norm(v)).astype(np.float32))
    return np.stack(out)  # (N, 16)


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    """16 real 32x32 H.264 clips of 5 frames with stored (4, 2, 4, 4) latents, in 4 shards."""
    clips, out = tmp_path_factory.mktemp("clips"), tmp_path_factory.mktemp("latent-shards")
    return write_moving_clip_shards(clips, out, N_CLIPS, _embed)


def _cfg(shards, *extra: str, batch: int = GLOBAL_BATCH):
    return apply_overrides(
        get_recipe("dit-tiny"),
        [*SMALL, "data.source=shards", f"data.shards={shards}", f"data.batch_size={batch}", *extra],
    )


def _fit(rank, world, config, degrees, resume_from):
    """The trainer from ``config`` under ``degrees``; optionally restored from a checkpoint
    folder first. Returns the losses of the steps it trained and its start step. (One process:
    called in the test's own process.)"""
    tr = build_trainer(config, world, degrees)
    if resume_from:
        resume_trainer(tr, resume_from)
    start = tr.step
    return {"start": start, "losses": fit_collect(tr).losses}


def _resume_checks(rank, world, config, path):
    """Resume one process at the global batch from ``path``; then try the same checkpoint with
    another data seed, which must fail with a clear CheckpointError."""
    import dataclasses

    from vfm_core.checkpoints.manager import CheckpointError
    from vfm_core.config import load_yaml

    got = _fit(rank, world, config, {}, path)
    cfg = load_yaml(config)
    cfg = dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, seed=7))
    try:
        resume_trainer(build_trainer(cfg, world, {}), path)
        got["error"] = "loaded"
    except CheckpointError as e:
        got["error"] = str(e)
    return got


def _batches(rank, world, config, degrees, steps):
    """Keys, latent sums and bytes read by this rank's shard source over ``steps`` steps."""
    from vfm_core.config import load_yaml
    from vfm_core.parallel.dims import ParallelDims
    from vfm_core.train.trainer import training_source

    cfg = load_yaml(config)
    dims = ParallelDims(**degrees, world_size=world)
    dims.build_mesh("cpu")
    src, _ = training_source(cfg, dims)
    keys, sums = [], []
    for _ in range(steps):
        b = src.next_batch()
        keys.append(b.keys)
        sums.append(b.values.double().sum(dim=(1, 2, 3, 4)).tolist())  # (B,)
    return {"dp": dims.dp_rank(), "keys": keys, "sums": sums, "bytes": src.loader.bytes_read}


def _vfm_train(out, shards, *args: str) -> list[dict]:
    """``vfm train ARGS`` on the shards, called in this process (no interpreter importing the
    library once more: its ranks are torchrun's processes, one intra-op thread each); the rows
    of its ``metrics.jsonl``."""
    sets = set_args([*SMALL, "data.source=shards", f"data.shards={shards}"])
    with pytest.MonkeyPatch.context() as env:
        env.setenv("OMP_NUM_THREADS", "1")
        assert vfm_main([str(a) for a in ("train", "--out", out, *args, *sets)]) == 0
    return metrics_rows(out)


@pytest.fixture(scope="module")
def reference(shards, tmp_path_factory):
    """Losses of one process at the global batch ."""
    config = tmp_path_factory.mktemp("ref") / "run.yaml"
    save_yaml(_cfg(shards, f"train.steps={STEPS}", "tracking.mlflow=false"), config)
    got = _fit(0, 1, str(config), {}, "")
    assert got["start"] == 0 and len(got["losses"]) == STEPS
    return got["losses"]


def _close(got, want, tol):
    assert len(got) == len(want), (got, want)
    for step, (g, w) in enumerate(zip(got, want, strict=True), start=1):
        assert np.isfinite(g) and abs(g - w) <= tol * abs(w), (step, got, want)


def _mlflow_mfu(out, uri, steps):
    import mlflow

    summary = json.loads((out / "summary.json").read_text())
    client = mlflow.MlflowClient(tracking_uri=uri)
    run = client.get_run(summary["mlflow_run_id"])
    assert run.info.status == "FINISHED"
    assert run.data.params["data.source"] == "shards"
    for key in ("loss", "mfu", "tflops", "data_wait"):
        history = client.get_metric_history(run.info.run_id, key)
        assert len(history) == steps, key
        assert all(np.isfinite(m.value) and m.value >= 0 for m in history), key
    assert all(m.value > 0 for m in client.get_metric_history(run.info.run_id, "mfu"))
    return summary


def test_rebatch_state_converts_between_steps_and_names_pending_samples():
    state = {
        "version": 1,
        "kind": "shard_loader",
        "batch_size": 2,
        "max_tokens": None,
        "planner": {"position": 8, "steps": 2, "n_skipped": 0, "waiting": [[]], "ready": []},
    }
    assert rebatch_state(state, 4)["batch_size"] == 4
    assert rebatch_state(state, 4)["planner"] == state["planner"]
    assert rebatch_state(state, 2) is state
    pending = {**state, "planner": {**state["planner"], "waiting": [[8]], "ready": [[5, 6]]}}
    with pytest.raises(LoaderStateError, match=r"batch_size=2, now 4.*1 waiting, 2 ready"):
        rebatch_state(pending, 4)


def test_source_rejects_a_state_of_another_dataset(shards, tmp_path):
    cfg = _cfg(shards, "data.seed=1")
    state = ShardLatentSource(cfg.data, cfg.model).state_dict()
    other = _cfg(shards, "data.seed=2")
    with pytest.raises(LoaderStateError, match="seed: state 1 vs loader 2"):
        ShardLatentSource(other.data, other.model).load_state_dict(state)


@pytest.mark.slow
def test_dp_slices_are_the_global_batch_and_mp_ranks_read_a_share(shards, tmp_path):
    steps = 3
    glob = ShardLatentSource(_cfg(shards).data, _cfg(shards).model)
    want = [glob.next_batch() for _ in range(steps)]
    config = tmp_path / "run.yaml"
    save_yaml(_cfg(shards), config)  # the global batch
    ranks = run_ranks(_batches, 4, str(config), dict(dp_shard=2, tp=2), steps)
    assert [r["dp"] for r in ranks] == [0, 0, 1, 1]  # tp innermost: ranks 0,1 share dp rank 0
    for s in range(steps):
        assert ranks[0]["keys"][s] + ranks[2]["keys"][s] == want[s].keys  # dp order = global
        got = ranks[0]["sums"][s] + ranks[2]["sums"][s]
        np.testing.assert_allclose(got, want[s].values.double().sum(dim=(1, 2, 3, 4)).numpy())
        for a, b in ((0, 1), (2, 3)):  # both TP ranks of a slice hold the same batch
            assert ranks[a]["keys"][s] == ranks[b]["keys"][s]
            assert ranks[a]["sums"][s] == ranks[b]["sums"][s]
    # each of the 4 ranks read one of the 4 samples per step: together each sample once
    rows = glob.loader.index.samples.set_index("key")
    total = int(sum(rows.at[k, "length"] for b in want for k in b.keys))
    assert sum(r["bytes"] for r in ranks) == total
    assert all(0 < r["bytes"] < total / 2 for r in ranks)


@pytest.mark.slow
def test_vfm_train_dp2_from_shards_matches_one_process_and_resumes(shards, reference, tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    dp2 = ["--nproc", "2", "--dp-shard", "2"]  # the global batch: GLOBAL_BATCH / 2 per dp rank
    out = tmp_path / "dp2"
    rows = _vfm_train(
        out,
        shards,
        "--steps",
        str(STEPS),
        *dp2,
        "--set",
        "train.ckpt_every=2",
        "--set",
        f"tracking.tracking_uri={uri}",
    )
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))
    _close([r["loss"] for r in rows], reference, 1e-5)
    summary = _mlflow_mfu(out, uri, STEPS)
    assert summary["degrees"]["dp_shard"] == 2

    # its step-2 checkpoint, resumed by new processes in a fresh folder: the same losses
    saved = out / "checkpoints" / "step_00000002"
    state = json.loads((saved / "state.json").read_text())["state"]["data"]
    assert state["kind"] == "shard_loader" and state["planner"]["position"] == 2 * GLOBAL_BATCH
    half = tmp_path / "half"
    shutil.copytree(saved, half / "checkpoints" / saved.name)
    resumed = _vfm_train(half, shards, "--steps", str(STEPS), *dp2, "--no-mlflow", "--resume")
    assert [r["step"] for r in resumed] == [3, 4]
    assert [r["loss"] for r in resumed] == [r["loss"] for r in rows][2:]

    # the same checkpoint under another layout: one process (2 -> 4 samples per dp rank at the
    # same global batch: the loader state is re-batched)
    config = tmp_path / "one.yaml"
    save_yaml(_cfg(shards, f"train.steps={STEPS}", "tracking.mlflow=false"), config)
    got = _resume_checks(0, 1, str(config), str(saved))
    assert got["start"] == 2
    _close(got["losses"], [r["loss"] for r in rows][2:], 1e-5)
    assert "step_00000002" in got["error"]
    assert "loader state belongs to another dataset" in got["error"]
    assert "seed: state 0 vs loader 7" in got["error"]


@pytest.mark.slow
def test_vfm_train_tp2_cp2_from_shards_matches_one_process(shards, reference, tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    out = tmp_path / "tp2cp2"
    rows = _vfm_train(
        out,
        shards,
        "--steps",
        str(STEPS),
        "--nproc",
        "4",
        "--tp",
        "2",
        "--cp",
        "2",
        "--set",
        f"tracking.tracking_uri={uri}",
    )
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))
    _close([r["loss"] for r in rows], reference, 1e-4)
    summary = _mlflow_mfu(out, uri, STEPS)
    assert summary["degrees"] == {"pp": 1, "dp_replicate": 1, "dp_shard": 1, "cp": 2, "tp": 2}
