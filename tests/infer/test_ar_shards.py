"""The autoregressive family from shards: encode-shards with a discrete tokenizer writes the FSQ
codes and their int32 ids ({key}.tokens.npy, on the latent grid); ar-tiny trains from those
shards; a continuous tokenizer or one with another vocabulary is refused in one line."""

from __future__ import annotations

import io
import tarfile

import numpy as np
import pytest

from vfm_core.config import ConfigError, apply_overrides
from vfm_core.data.index import read_index
from vfm_core.families.sources import make_source
from vfm_core.recipes import get_recipe
from vfm_core.tokenizer import TokenizerConfig, save_tokenizer
from vfm_core.tokenizer.autoencoder import CausalVideoAutoencoder
from vfm_core.train.main import run_training


def test_encoded_shards_hold_token_ids(token_shards):
    root, _ = token_shards
    index = read_index(str(root / "dst"))
    assert index.meta["latents"]["fsq_levels"] == [4, 4, 4, 4]
    name = index.shards.iloc[0]["name"]
    with tarfile.open(root / "dst" / name) as tar:
        member = next(m for m in tar if m.name.endswith(".tokens.npy"))
        ids = np.load(io.BytesIO(tar.extractfile(member).read()), allow_pickle=False)
    assert ids.dtype == np.int32 and ids.shape == (3, 8, 8)
    assert ids.min() >= 0 and ids.max() < 256


def test_ar_tiny_trains_from_token_shards(token_shards, tmp_path):
    root, tok = token_shards
    sets = [
        "data.source=shards",
        f"data.shards={root / 'dst'}",
        f"data.tokenizer={tok}",
        "data.batch_size=2",
        "model.depth=2",
        "train.steps=3",
        "tracking.mlflow=false",
    ]
    cfg = apply_overrides(get_recipe("ar-tiny"), sets)
    summary = run_training(cfg, out_dir=tmp_path / "run", progress=False)
    assert summary["step"] == 3 and np.isfinite(summary["metrics"]["loss"])


def test_tokenizers_that_do_not_fit_are_refused(token_shards, tmp_path):
    root, _ = token_shards
    base = ["data.source=shards", f"data.shards={root / 'dst'}"]
    with pytest.raises(ConfigError, match="data.tokenizer=DIR"):
        cfg = apply_overrides(get_recipe("ar-tiny"), base)
        make_source(cfg.data, cfg.model)
    cont = save_tokenizer(CausalVideoAutoencoder(TokenizerConfig()), tmp_path / "c").parent
    cfg = apply_overrides(get_recipe("ar-tiny"), [*base, f"data.tokenizer={cont}"])
    with pytest.raises(ConfigError, match="it is continuous"):
        make_source(cfg.data, cfg.model)


def test_ar_tiny_trains_packed_from_token_shards(token_shards, tmp_path):
    """Two 192-token videos per 400-token pack: causal document masks, real tokens only."""
    root, tok = token_shards
    sets = [
        "data.source=shards",
        f"data.shards={root / 'dst'}",
        f"data.tokenizer={tok}",
        "data.batch_size=1",
        "data.max_tokens=400",
        "model.depth=2",
        "train.steps=3",
        "tracking.mlflow=false",
    ]
    cfg = apply_overrides(get_recipe("ar-tiny"), sets)
    summary = run_training(cfg, out_dir=tmp_path / "run", progress=False)
    assert summary["step"] == 3 and np.isfinite(summary["metrics"]["loss"])
    assert summary["metrics"]["tokens_per_s"] > 0
