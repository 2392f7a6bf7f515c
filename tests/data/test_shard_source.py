"""The trainer trains from shards: stored latents, or clips decoded and encoded by the tokenizer;
data wait logged; a resumed run continues the data stream exactly."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import torch
from datagen import hash_embed

from vfm_core.config import ConfigError, apply_overrides
from vfm_core.data.shard_source import ShardLatentSource
from vfm_core.data.shards import write_shards
from vfm_core.families.sources import make_source
from vfm_core.recipes import get_recipe
from vfm_core.train.main import run_training

SMALL = [
    "data.latent_frames=2",
    "data.latent_height=4",
    "data.latent_width=4",
    "data.batch_size=2",
    "model.depth=2",
    "model.hidden=64",
    "model.heads=2",
    "model.adaln_lora_rank=8",
    "model.text_dim=16",
    "tracking.mlflow=false",
    "optim.warmup_steps=1",
]


def config(shards, *extra):
    return apply_overrides(
        get_recipe("dit-tiny"), SMALL + ["data.source=shards", f"data.shards={shards}", *extra]
    )


@pytest.fixture(scope="module")
def latent_shards(clips_dir, tmp_path_factory):
    df = pd.read_parquet(clips_dir / "clips.parquet")
    rng = np.random.default_rng(0)
    lat = {c: rng.standard_normal((4, 3, 6, 6)).astype(np.float32) for c in df["clip_id"]}
    out = tmp_path_factory.mktemp("latent-shards")
    write_shards(df, str(out), embed=hash_embed, base_url=str(clips_dir), latents=lat)
    return out, lat


def test_source_reads_latents_with_the_configured_shape(latent_shards):
    out, lat = latent_shards
    cfg = config(out)
    src = ShardLatentSource(cfg.data, cfg.model)
    b = src.next_batch()
    assert tuple(b.values.shape) == (2, 4, 2, 4, 4) and tuple(b.text.shape) == (2, 8, 16)
    k = b.keys[0]
    np.testing.assert_array_equal(b.values[0].numpy(), lat[k][:, :2, 1:5, 1:5])  # centre crop
    assert b.text[0, 1:].abs().sum() == 0  # one pooled caption vector, zero padded to text_len
    assert src.data_wait_s > 0


def test_random_clip_start_draws_windows_of_the_clip_repeatably(latent_shards):
    out, lat = latent_shards
    cfg = config(out, "data.clip_start=random")
    a, b = ShardLatentSource(cfg.data, cfg.model), ShardLatentSource(cfg.data, cfg.model)
    starts = []
    for _ in range(6):
        ba, bb = a.next_batch(), b.next_batch()
        assert torch.equal(ba.values, bb.values)  # (seed, position) -> the same windows
        for k, z in zip(ba.keys, ba.values.numpy()):
            fits = [t0 for t0 in range(2) if np.array_equal(z, lat[k][:, t0 : t0 + 2, 1:5, 1:5])]
            assert len(fits) == 1, k  # a window of 2 of the clip's 3 latent frames
            starts += fits
    assert set(starts) == {0, 1}  # both windows drawn, not only the first frames


def test_trainer_runs_from_latent_shards_and_resumes_exactly(latent_shards, tmp_path):
    out, _ = latent_shards
    full = run_training(config(out, "train.steps=4"), out_dir=tmp_path / "a", progress=False)
    run_training(config(out, "train.steps=2"), out_dir=tmp_path / "b", progress=False)
    resumed = run_training(
        config(out, "train.steps=4"), out_dir=tmp_path / "b", resume=True, progress=False
    )
    assert full["step"] == resumed["step"] == 4
    assert resumed["metrics"]["loss"] == full["metrics"]["loss"]  # same batches after restore
    rows = [json.loads(x) for x in (tmp_path / "a" / "metrics.jsonl").open()]
    assert all(0 <= r["data_wait"] <= 1 for r in rows)


@pytest.mark.slow
def test_trainer_decodes_clips_and_applies_the_tokenizer(shard_dir, tmp_path):
    import torch

    from vfm_core.tokenizer import CausalVideoAutoencoder, get_tokenizer_config, save_tokenizer

    torch.manual_seed(0)
    save_tokenizer(CausalVideoAutoencoder(get_tokenizer_config("tok-tiny")), tmp_path / "tok")
    cfg = config(shard_dir, f"data.tokenizer={tmp_path / 'tok'}", "train.steps=2")
    with pytest.raises(ConfigError, match="the shard source was given no tokenizer"):
        ShardLatentSource(cfg.data, cfg.model)  # data loads no network itself
    src = make_source(cfg.data, cfg.model)  # the run's tokenizer, loaded and injected
    assert isinstance(src, ShardLatentSource) and src.tokenizer is not None
    b = src.next_batch()
    assert tuple(b.values.shape) == (2, 4, 2, 4, 4) and torch.isfinite(b.values).all()
    # only clips with >= 5 frames of >= 32x32 qualify for this training shape
    assert all(src.loader.index.samples.set_index("key").loc[k, "frames"] >= 5 for k in b.keys)
    summary = run_training(cfg, out_dir=tmp_path / "run", progress=False)
    assert summary["step"] == 2 and np.isfinite(summary["metrics"]["loss"])


def test_shard_source_config_errors(shard_dir, tmp_path):
    cfg = apply_overrides(get_recipe("dit-tiny"), ["data.source=shards"])
    with pytest.raises(ConfigError, match="data.shards: set the shard directory"):
        ShardLatentSource(cfg.data, cfg.model)
    cfg = config(shard_dir, "model.text_dim=384")
    with pytest.raises(ConfigError, match="model.text_dim=384 but the shards' caption"):
        ShardLatentSource(cfg.data, cfg.model)
    cfg = config(shard_dir)
    with pytest.raises(ConfigError, match="holds a clip but no latent .*set data.tokenizer=DIR"):
        ShardLatentSource(cfg.data, cfg.model).next_batch()
