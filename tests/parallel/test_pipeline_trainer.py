"""Pipeline parallelism in the trainer: ``vfm train --nproc 2 --pp 2`` and ``--nproc 4 --pp 2
--dp-shard 2`` train the tiny preset and track the 1-process run step for step (loss of the global
batch and the global gradient norm, fp32, relative tolerance 1e-5), with the spine's
``DIR/metrics.jsonl`` contract and MLflow (loss, TFLOPS and MFU per process) from rank 0, from the
synthetic source and from WebDataset shards; layouts and requests the pipeline trainer cannot serve
fail with one clear line. The one-process references, and ``vfm train`` itself (its ranks are
torchrun's processes), run in the test's process."""

from __future__ import annotations

import dataclasses
import json

import pytest
from parallel_harness import (
    build_trainer,
    fit_collect,
    launch_ok,
    metrics_rows,
    one_process,
    set_args,
    vfm_main_ok,
    write_moving_clip_shards,
)

from vfm_core.config import apply_overrides, load_yaml, save_yaml
from vfm_core.recipes import get_recipe
from vfm_core.train.launch import torchrun_argv

TOL = 1e-5
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
    "tracking.experiment=test-pipeline-trainer",
]


def _fit_one_process(rank, world, config):
    return fit_collect(build_trainer(config, world, {})).column("loss", "grad_norm")


def _track(rows, reference, steps):
    assert [r["step"] for r in rows] == list(range(1, steps + 1))
    for row, ref in zip(rows, reference, strict=True):
        for key in ("loss", "grad_norm"):
            assert abs(row[key] - ref[key]) <= TOL * abs(ref[key]), (row["step"], key, row, ref)
        assert row["tflops"] > 0 and 0 < row["mfu"] < 1
    assert sum(r["loss"] for r in reference[-3:]) < sum(r["loss"] for r in reference[:3])


@pytest.mark.slow
def test_vfm_train_pp2_tracks_one_process_and_logs_mlflow(tmp_path):
    import mlflow

    from vfm_core.tracking import tracking_uri

    steps = 8
    out = tmp_path / "pp2"
    sets = set_args(TINY)
    vfm_main_ok("train", "--nproc", "2", "--pp", "2", "--steps", steps, "--out", out, *sets)
    rows = metrics_rows(out)
    reference = one_process(_fit_one_process, str(out / "run.yaml"))
    _track(rows, reference, steps)

    summary = json.loads((out / "summary.json").read_text())
    assert summary["degrees"] == {"pp": 2, "dp_replicate": 1, "dp_shard": 1, "cp": 1, "tp": 1}
    assert summary["checkpoint"].endswith(f"step_{steps:08d}")  # pp saves like other layouts
    cfg = load_yaml(out / "run.yaml")
    client = mlflow.MlflowClient(tracking_uri=tracking_uri(cfg.tracking))
    run = client.get_run(summary["mlflow_run_id"])
    assert run.info.status == "FINISHED"
    assert run.data.params["world_size"] == "2" and run.data.params["parallel.pp"] == "2"
    for key in ("loss", "mfu", "tflops"):
        history = client.get_metric_history(run.info.run_id, key)
        assert len(history) == steps and all(m.value > 0 for m in history), key


@pytest.mark.slow
def test_torchrun_pp2_fsdp2_tracks_one_process(tmp_path):
    steps = 6
    cfg = apply_overrides(
        get_recipe("dit-tiny"), [*TINY, f"train.steps={steps}", "data.batch_size=4"]
    )
    cfg = dataclasses.replace(cfg, tracking=dataclasses.replace(cfg.tracking, mlflow=False))
    config = tmp_path / "run.yaml"
    save_yaml(cfg, config)
    reference = one_process(_fit_one_process, str(config))  # the same global batch

    out = tmp_path / "pp2dp2"
    rows = launch_ok(torchrun_argv(4, config=config, out=out, pp=2, dp_shard=2), out)
    _track(rows, reference, steps)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["world_size"] == 4 and summary["degrees"]["dp_shard"] == 2


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    """8 real 32x32 H.264 clips with stored (4, 2, 4, 4) latents and 16-d caption vectors."""
    import numpy as np

    def embed(captions: list[str]) -> np.ndarray:  # (N, 16) unit vectors seeded by the text
        v = [np.random.default_rng(sum(map(ord, c))).standard_normal(16) for c in captions]
        return np.stack([x / np.linalg.norm(x) for x in v]).astype(np.float32)

    clips, out = tmp_path_factory.mktemp("clips"), tmp_path_factory.mktemp("latent-shards")
    return write_moving_clip_shards(clips, out, 8, embed)


@pytest.mark.slow
def test_torchrun_pp2_fsdp2_from_shards_tracks_one_process(shards, tmp_path):
    """With ``data.source: shards`` each dp rank's pipeline gets its own slice from the loader
    (the pp ranks of one slice read half of it each and all-gather)."""
    steps = 4
    small = [
        "model.hidden=64",
        "model.depth=2",
        "model.text_dim=16",
        "data.latent_frames=2",
        "data.latent_height=4",
        "data.latent_width=4",
        "train.device=cpu",
        "optim.warmup_steps=1",
        "optim.lr=0.002",
        "tracking.mlflow=false",
        "data.source=shards",
        f"data.shards={shards}",
        f"train.steps={steps}",
    ]
    config = tmp_path / "run.yaml"
    save_yaml(apply_overrides(get_recipe("dit-tiny"), [*small, "data.batch_size=4"]), config)
    reference = one_process(_fit_one_process, str(config))
    out = tmp_path / "pp2dp2"
    rows = launch_ok(torchrun_argv(4, config=config, out=out, pp=2, dp_shard=2), out)
    assert [r["step"] for r in rows] == list(range(1, steps + 1))
    for row, ref in zip(rows, reference, strict=True):
        for key in ("loss", "grad_norm"):
            assert abs(row[key] - ref[key]) <= TOL * abs(ref[key]), (row["step"], key, row, ref)
    assert rows[0]["tokens_per_s"] > 0


def test_pipeline_layouts_are_named_before_training(tmp_path, capsys):
    from vfm_core.config import ConfigError
    from vfm_core.parallel.layout import validate_layout, with_degrees
    from vfm_core.train.main import main

    cfg = apply_overrides(get_recipe("dit-tiny"), [*TINY, "train.steps=1", "data.batch_size=3"])
    bad = [
        (
            dict(pp=2),
            2,
            [],
            "pass holds 3 samples .* cannot be split into parallel.pp_microbatches=2 microbatches",
        ),
        (dict(pp=4, dp_shard=1), 4, [], "4 ranks x 1 virtual stages need at least 4 blocks"),
        (dict(pp=2, tp=2, cp=2), 4, [], "product|world size"),
        (
            dict(pp=2),
            2,
            ["data.batch_size=4", "parallel.pp_microbatches=1"],
            "pp_microbatches=1 is below the 2 pipeline stages",
        ),
        (
            dict(pp=2),
            2,
            ["data.batch_size=4", "parallel.pp_virtual_stages=2"],
            "pp_virtual_stages=2 needs parallel.pp_schedule=interleaved_1f1b",
        ),
        (
            dict(pp=2),
            2,
            [
                "data.batch_size=4",
                "parallel.pp_virtual_stages=2",
                "parallel.pp_schedule=interleaved_1f1b",
            ],
            "2 ranks x 2 virtual stages need at least 4 blocks, model.depth is 3",
        ),
        (
            dict(pp=2),
            2,
            [
                "data.batch_size=4",
                "parallel.pp_virtual_stages=2",
                "model.depth=5",
                "parallel.pp_schedule=interleaved_1f1b",
            ],
            "the 5 blocks .* cannot be cut into pp x virtual stages = 4",
        ),
        (dict(pp=1), 1, ["parallel.pp_virtual_stages=2"], "needs pipeline parallelism"),
        (dict(pp=2), 2, ["data.batch_size=4", "train.grad_accum=3"], "train.grad_accum=3"),
    ]
    for degrees, world, sets, message in bad:
        with pytest.raises(ConfigError, match=message):
            validate_layout(with_degrees(apply_overrides(cfg, sets), **degrees), world)
    # the 4D layout and interleaving are trainable
    four_d = apply_overrides(
        cfg,
        [
            "data.batch_size=4",
            "model.depth=4",
            "parallel.pp_schedule=interleaved_1f1b",
            "parallel.pp_virtual_stages=2",
        ],
    )
    validate_layout(with_degrees(four_d, pp=2, tp=2, cp=2, dp_shard=1), 8)

    config = tmp_path / "run.yaml"
    save_yaml(cfg, config)
    assert (
        main(["--config", str(config), "--out", str(tmp_path / "o"), "--pp", "2", "--resume"]) == 2
    )
    err = capsys.readouterr().err
    assert f"--resume: no checkpoint under {tmp_path / 'o' / 'checkpoints'}" in err
    assert not (tmp_path / "o").exists()
