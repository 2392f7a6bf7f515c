"""What a run on encoded shards takes from them (vfm_core.tokenizer.run_settings): the same
derivation for the pipeline and ``vfm train``; the user's own keys win; a blend must agree;
unreadable shards or tokenizers give nothing (the run's loader names them)."""

from __future__ import annotations

import json
import shutil

import pytest
import yaml

from vfm_core.cli import main
from vfm_core.config import ConfigError, apply_overrides
from vfm_core.families.data_settings import data_settings, with_data_settings
from vfm_core.recipes import get_recipe
from vfm_core.tokenizer import TokenizerConfig, save_tokenizer
from vfm_core.tokenizer.autoencoder import CausalVideoAutoencoder
from vfm_core.tokenizer.run_settings import MAX_TEXT_LEN, dataset_settings, model_settings


def test_model_settings_follow_the_family_and_cap_the_captions():
    geometry = {"latent_channels": 6, "vocab_size": 0, "temporal_factor": 4, "spatial_factor": 8}
    assert model_settings(discrete=False, geometry=geometry, caption_tokens=9) == {
        "diffusion.sigma_data": 1.0,
        "model.in_channels": 6,
        "model.text_len": 9,
    }
    discrete = {**geometry, "vocab_size": 625}
    assert model_settings(discrete=True, geometry=discrete, normalized=False) == {
        "model.vocab_size": 625
    }
    assert model_settings(discrete=True, geometry=geometry, caption_tokens=10**6) == {
        "diffusion.sigma_data": 1.0,
        "model.text_len": MAX_TEXT_LEN,
    }


def fake_index(root, meta) -> str:
    """An index.json with ``meta`` (the derivation reads nothing else)."""
    root.mkdir(parents=True)
    (root / "index.json").write_text(json.dumps({"schema_version": 1, "meta": meta}))
    return str(root)


@pytest.fixture(scope="module")
def tok6(tmp_path_factory):
    """A continuous tokenizer with 8 latent channels (the recipes' DiTs take 16)."""
    root = tmp_path_factory.mktemp("tok6")
    model = CausalVideoAutoencoder(TokenizerConfig(latent_channels=8))
    return str(save_tokenizer(model, root / "tok").parent)


def test_encoded_shards_name_their_tokenizer_and_the_run_takes_its_channels(tmp_path, tok6):
    meta = {"latents": {"tokenizer": tok6, "normalized": True}, "caption_tokens": {"max": 11}}
    root = fake_index(tmp_path / "lat", meta)
    assert dataset_settings(root, discrete=False) == {
        "model.in_channels": 8,
        "data.tokenizer": tok6,
    }  # sigma_data and text_len: the pipeline's own choices (model_settings), not forced
    # the run names its tokenizer: that one, and data.tokenizer stays the run's
    assert "data.tokenizer" not in dataset_settings(root, discrete=False, tokenizer=tok6)
    cfg = apply_overrides(get_recipe("dit-tiny"), ["data.source=shards", f"data.shards={root}"])
    assert cfg.model.in_channels != 8
    derived = with_data_settings(cfg, given={"data.tokenizer"})
    assert derived.model.in_channels == 8 and derived.data.tokenizer == ""  # the user's key wins
    assert derived.model.text_len == cfg.model.text_len and derived.diffusion == cfg.diffusion
    # unreadable shards or tokenizer: nothing derived, the run's loader says what is wrong
    assert dataset_settings(str(tmp_path / "missing"), discrete=False) == {}
    gone = fake_index(tmp_path / "gone", {"latents": {"tokenizer": str(tmp_path / "no-tok")}})
    assert dataset_settings(gone, discrete=False) == {}
    synthetic = get_recipe("dit-tiny")
    assert data_settings(synthetic) == {} and with_data_settings(synthetic, set()) is synthetic


def test_a_blend_whose_datasets_disagree_is_named(tmp_path, tok6):
    a = fake_index(tmp_path / "a", {"latents": {"tokenizer": tok6}})
    b = fake_index(tmp_path / "b", {"latents": {"tokenizer": tok6}})
    other = shutil.copytree(tok6, tmp_path / "other-tok")  # the same net, saved elsewhere
    c = fake_index(tmp_path / "c", {"latents": {"tokenizer": str(other)}})
    base = get_recipe("dit-tiny")
    cfg = apply_overrides(base, ["data.source=shards", f"data.blend={a}:1,{b}:1"])
    assert data_settings(cfg) == {"model.in_channels": 8, "data.tokenizer": tok6}
    cfg = apply_overrides(base, ["data.source=shards", f"data.blend={a}:1,{c}:1"])
    with pytest.raises(ConfigError, match=r"data.tokenizer: the datasets of data.blend disagree"):
        data_settings(cfg)
    assert with_data_settings(cfg, {"data.tokenizer"}).model.in_channels == 8


def test_vfm_train_on_token_shards_takes_the_tokenizer_they_record(token_shards, tmp_path):
    """No data.tokenizer, no model.vocab_size: the encoded shards say both, as in the pipeline."""
    root, tok = token_shards
    out = tmp_path / "run"
    argv = ["train", "--recipe", "ar-tiny", "--steps", "1", "--no-mlflow", "--out", str(out)]
    sets = ["data.source=shards", f"data.shards={root / 'dst'}", "data.batch_size=2"]
    sets += ["model.depth=1", "model.vocab_size=256"]
    assert main(argv + [a for s in sets for a in ("--set", s)]) == 0
    cfg = yaml.safe_load((out / "config.yaml").read_text())
    assert cfg["data"]["tokenizer"] == str(tok)
    assert cfg["model"]["text_len"] == get_recipe("ar-tiny").model.text_len  # the recipe's
    # a key the user sets is kept, and a tokenizer that does not fit is still refused
    bad = sets[:-1] + ["model.vocab_size=99"]
    assert main([*argv[:-1], str(tmp_path / "bad")] + [a for s in bad for a in ("--set", s)]) == 2
