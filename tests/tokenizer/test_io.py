"""Tokenizer safetensors round trip and the external-weights loader's errors."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from vfm_core.tokenizer import (
    CausalVideoAutoencoder,
    TokenizerConfig,
    TokenizerLoadError,
    load_external_tokenizer,
    load_tokenizer,
    save_tokenizer,
)

CFG = dict(base_channels=16, norm_groups=8)


@pytest.fixture(scope="module")
def model() -> CausalVideoAutoencoder:
    torch.manual_seed(0)
    m = CausalVideoAutoencoder(TokenizerConfig(**CFG, regulariser="kl")).eval()
    m.set_latent_stats(torch.tensor([0.1, -0.2, 0.3, 0.0]), torch.tensor([1.5, 0.5, 2.0, 1.0]))
    return m


def test_round_trip_bit_identical(model, tmp_path):
    path = save_tokenizer(model, tmp_path / "tok", metadata={"note": "x"})
    assert path.name == "tokenizer.safetensors"
    assert json.loads((tmp_path / "tok" / "config.json").read_text())["regulariser"] == "kl"
    with safe_open(str(path), framework="pt") as f:
        meta = f.metadata()
    assert meta["format"] == "vfm-tokenizer" and meta["note"] == "x"
    loaded = load_tokenizer(tmp_path / "tok", expected_latent_channels=4)
    assert loaded.cfg == model.cfg
    assert torch.equal(loaded.latent_std, model.latent_std)
    x = torch.rand(1, 3, 9, 32, 32) * 2 - 1  # (B, 3, T, H, W)
    with torch.no_grad():
        z, z2 = model.encode(x), loaded.encode(x)
        assert torch.equal(z, z2)
        assert torch.equal(model.decode(z), loaded.decode(z2))
    assert load_tokenizer(path).cfg == model.cfg  # the file itself works too


def test_load_errors(model, tmp_path):
    with pytest.raises(TokenizerLoadError, match="not found"):
        load_tokenizer(tmp_path / "missing")
    save_tokenizer(model, tmp_path / "tok")
    with pytest.raises(TokenizerLoadError, match="4 latent channels, expected 16"):
        load_tokenizer(tmp_path / "tok", expected_latent_channels=16)
    foreign = tmp_path / "foreign.safetensors"
    save_file({"w": torch.zeros(2)}, str(foreign))
    with pytest.raises(TokenizerLoadError, match="not a vfm tokenizer checkpoint"):
        load_tokenizer(foreign)
    garbage = tmp_path / "garbage.safetensors"
    garbage.write_bytes(b"\x00" * 16)
    with pytest.raises(TokenizerLoadError, match="cannot read"):
        load_tokenizer(garbage)


def write_external(directory, model, *, prefix="net.", cfg=None, drop_stats=True):
    """A Cosmos-style layout: different tensor names, a config.json, no latent stats."""
    directory.mkdir(parents=True, exist_ok=True)
    sd = {
        prefix + k: v.contiguous()
        for k, v in model.state_dict().items()
        if not (drop_stats and k.startswith("latent_"))
    }
    save_file(sd, str(directory / "autoencoder.safetensors"))
    (directory / "config.json").write_text(json.dumps(cfg or model.cfg.to_dict()))


def test_external_loader_maps_names(model, tmp_path):
    d = tmp_path / "ext"
    write_external(d, model)
    cfg = {**model.cfg.to_dict(), "latent_mean": [0.1, -0.2, 0.3, 0.0]}
    cfg["latent_std"] = [1.5, 0.5, 2.0, 1.0]
    (d / "config.json").write_text(json.dumps(cfg))
    ext = load_external_tokenizer(d, key_map={"net.": ""}, expected_latent_channels=4)
    x = torch.rand(1, 3, 5, 32, 32) * 2 - 1
    with torch.no_grad():
        assert torch.equal(ext.encode(x), model.encode(x))
    # a callable map works too; no stats -> identity scaling with a warning
    write_external(d, model)
    with pytest.warns(UserWarning, match="no latent statistics"):
        ext = load_external_tokenizer(d, key_map=lambda k: k.removeprefix("net."))
    assert torch.equal(ext.latent_std, torch.ones(4))


def test_external_loader_errors(model, tmp_path):
    with pytest.raises(TokenizerLoadError, match="directory not found"):
        load_external_tokenizer(tmp_path / "nope")
    d = tmp_path / "ext"
    d.mkdir()
    with pytest.raises(TokenizerLoadError, match="config not found"):
        load_external_tokenizer(d)
    (d / "config.json").write_text(json.dumps(model.cfg.to_dict()))
    with pytest.raises(TokenizerLoadError, match=r"exactly one \*.safetensors file, found \[\]"):
        load_external_tokenizer(d)
    with pytest.raises(TokenizerLoadError, match="weights not found"):
        load_external_tokenizer(d, weights_file="w.safetensors")

    write_external(d, model)
    with pytest.raises(TokenizerLoadError, match="missing.*unexpected.*net.decoder"):
        load_external_tokenizer(d)  # names not mapped
    with pytest.raises(TokenizerLoadError, match="4 latent channels, expected 16"):
        load_external_tokenizer(d, key_map={"net.": ""}, expected_latent_channels=16)

    (d / "config.json").write_text(json.dumps({**model.cfg.to_dict(), "latent_channels": 8}))
    with pytest.raises(TokenizerLoadError, match="latent channel mismatch.*latent_channels=8"):
        load_external_tokenizer(d, key_map={"net.": ""})

    (d / "config.json").write_text(json.dumps({**model.cfg.to_dict(), "base_channels": 32}))
    with pytest.raises(TokenizerLoadError, match=r"tensor \S+ has shape .* expects"):
        load_external_tokenizer(d, key_map={"net.": ""})

    (d / "config.json").write_text(json.dumps({**model.cfg.to_dict(), "depth": 3}))
    with pytest.raises(TokenizerLoadError, match="tokenizer.depth: unknown key"):
        load_external_tokenizer(d, key_map={"net.": ""})
