"""Fixtures of the generation tests: a tiny DiT run directory in the real `vfm train` layout (random
non-trivial weights, so every block and the ring attention matter), a tiny random tokenizer, and
a real prompt embedding from the caption text embedder."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from vfm_core.checkpoints.manager import CheckpointManager
from vfm_core.config import apply_overrides, save_yaml, to_dict, validate
from vfm_core.families import build_model
from vfm_core.recipes import get_recipe
from vfm_core.tokenizer import CausalVideoAutoencoder, TokenizerConfig, save_tokenizer

TINY = [
    "model.hidden=64",
    "model.depth=2",
    "model.heads=4",
    "model.adaln_lora_rank=16",
    "data.latent_height=8",
    "data.latent_width=8",
    "diffusion.num_steps=4",
    "train.device=cpu",
]
PROMPT = "a red disc moving right over a blue gradient"


def make_run(root: Path, overrides: list[str] = (), *, seed: int = 0, scale: float = 0.05) -> Path:
    """A run dir (config.yaml + checkpoints/step_00000001) holding a random DiT."""
    cfg = validate(apply_overrides(get_recipe("dit-tiny"), [*TINY, *overrides]))
    torch.manual_seed(seed)
    model = build_model(cfg.model)
    with torch.no_grad():  # leave the AdaLN-zero identity init: blocks must change the result
        for p in model.parameters():
            p.add_(torch.randn_like(p) * scale)
    sd = model.state_dict()
    state = {"model": sd, "ema": {k: v.clone() for k, v in sd.items()}}
    meta = {"model": to_dict(cfg.model), "recipe": cfg.recipe}
    CheckpointManager(root).save(1, state, meta=meta)
    save_yaml(cfg, root / "config.yaml")
    return root


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory) -> Path:
    return make_run(tmp_path_factory.mktemp("run"))


@pytest.fixture(scope="session")
def tiny_tokenizer(tmp_path_factory) -> Path:
    torch.manual_seed(1)
    tok = CausalVideoAutoencoder(TokenizerConfig(base_channels=16))
    path = tmp_path_factory.mktemp("tok")
    save_tokenizer(tok, path)
    return path


@pytest.fixture(scope="session")
def prompt_emb() -> np.ndarray:
    from vfm_core.infer.generate import embed_prompt

    return embed_prompt(PROMPT)  # (1, 384) from all-MiniLM-L6-v2


@pytest.fixture(scope="session")
def ar_run(tmp_path_factory) -> Path:
    """An untrained ar-tiny run (depth 2) in the `vfm train` layout."""
    root = tmp_path_factory.mktemp("ar-run")
    cfg = validate(apply_overrides(get_recipe("ar-tiny"), ["model.depth=2", "train.device=cpu"]))
    torch.manual_seed(0)
    sd = build_model(cfg.model).state_dict()
    state = {"model": sd, "ema": {k: v.clone() for k, v in sd.items()}}
    CheckpointManager(root).save(1, state, meta={"model": to_dict(cfg.model)})
    save_yaml(cfg, root / "config.yaml")
    return root
