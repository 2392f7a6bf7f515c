"""Fixtures of the registry tests: a dit-tiny run really trained for 2 steps (the `vfm train`
layout, a tiny random tokenizer as its ``data.tokenizer``) and an empty sqlite MLflow store per
test with the model cache beside it (:func:`registry_support.use_store`)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from registry_support import use_store

from vfm_core.config import TrackingConfig, apply_overrides, validate
from vfm_core.recipes import get_recipe

TINY = [
    "model.hidden=64",
    "model.depth=2",
    "model.heads=4",
    "model.adaln_lora_rank=16",
    "data.latent_height=8",
    "data.latent_width=8",
    "data.batch_size=2",
    "diffusion.num_steps=2",
    "train.device=cpu",
    "train.steps=2",
    "train.ckpt_every=2",
    "tracking.mlflow=false",
]


@pytest.fixture(scope="session")
def tokenizer_dir(tmp_path_factory) -> Path:
    from vfm_core.tokenizer import CausalVideoAutoencoder, TokenizerConfig, save_tokenizer

    torch.manual_seed(1)
    path = tmp_path_factory.mktemp("tok")
    save_tokenizer(CausalVideoAutoencoder(TokenizerConfig(base_channels=16)), path)
    return path


@pytest.fixture(scope="session")
def trained_run(tmp_path_factory, tokenizer_dir) -> Path:
    """``vfm train`` of dit-tiny for 2 steps (seconds): RUN/config.yaml + checkpoints/step_2."""
    from vfm_core.train.main import run_training

    cfg = validate(
        apply_overrides(get_recipe("dit-tiny"), [*TINY, f"data.tokenizer={tokenizer_dir}"])
    )
    out = tmp_path_factory.mktemp("trained") / "run"
    summary = run_training(cfg, out_dir=out, progress=False)
    assert summary["step"] == 2
    return out


@pytest.fixture
def store(tmp_path, monkeypatch) -> TrackingConfig:
    """An empty sqlite tracking + registry store in tmp_path; the model cache beside it."""
    return use_store(monkeypatch, tmp_path)
