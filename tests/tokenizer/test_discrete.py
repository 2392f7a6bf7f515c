"""The discrete (FSQ) tokenizer: trains on synthetic moving shapes to a PSNR above the trivial
baseline, token ids round-trip through save/load, a continuous tokenizer has no ids."""

from __future__ import annotations

import pytest
import torch

from vfm_core.config import ConfigError
from vfm_core.tokenizer import TokenizerConfig, load_tokenizer, synthetic_clips, train_tokenizer
from vfm_core.tokenizer.autoencoder import CausalVideoAutoencoder, TokenizerShapeError
from vfm_core.tokenizer.config import TokenizerConfigError, get_tokenizer_config
from vfm_core.tokenizer.from_shards import discrete_variant


def test_discrete_tokenizer_learns_and_round_trips(tmp_path):
    """tok-tiny-discrete (4x8x8, FSQ 4,4,4,4 = 256 ids), ~150 CPU steps on 32x32 clips."""
    cfg = get_tokenizer_config("tok-tiny-discrete")
    train = [synthetic_clips(8, frames=5, size=32, seed=i) for i in range(20)]
    held = [synthetic_clips(8, frames=5, size=32, seed=10_000)]
    model, m = train_tokenizer(
        cfg, train, steps=150, lr=2e-3, held_out=held, out_dir=tmp_path / "tok", progress=False
    )
    assert m.loss_last < 0.7 * m.loss_first, (m.loss_first, m.loss_last)
    assert m.psnr > m.baseline_psnr + 1.0, (m.psnr, m.baseline_psnr)
    assert 0 < m.codebook_usage <= 1
    x = held[0]
    with torch.no_grad():
        ids = model.encode_tokens(x)  # (B, 2, 4, 4)
        assert ids.shape == (8, 2, 4, 4) and ids.dtype == torch.long
        assert int(ids.min()) >= 0 and int(ids.max()) < model.vocab_size == 256
        # decoding the ids is decoding the quantised latent
        assert torch.allclose(model.decode_tokens(ids), model.decode(model.encode(x)), atol=1e-5)
        loaded = load_tokenizer(m.checkpoint)
        assert loaded.cfg.fsq_levels == (4, 4, 4, 4)
        assert torch.equal(loaded.encode_tokens(x), ids)


def test_discrete_config_errors():
    with pytest.raises(TokenizerConfigError, match="latent_channels must be 4"):
        TokenizerConfig(fsq_levels=(8, 5, 5, 5), latent_channels=3)
    with pytest.raises(TokenizerConfigError, match="regulariser none"):
        TokenizerConfig(fsq_levels=(8, 5, 5, 5), regulariser="kl")
    with pytest.raises(ConfigError, match="--discrete 8,1"):
        discrete_variant(TokenizerConfig(), (8, 1))
    cfg = discrete_variant(get_tokenizer_config("tok-4x8x8"), (8, 8, 8, 5, 5, 5))
    assert cfg.latent_channels == 6 and not cfg.shortcuts  # 512 % 6 != 0
    with pytest.raises(TokenizerShapeError, match="continuous"):
        CausalVideoAutoencoder(TokenizerConfig()).encode_tokens(torch.zeros(1, 3, 5, 16, 16))


def test_discrete_preset_penalises_the_prequantisation_latent():
    """tok-tiny-discrete trains with the L2 of the latent before FSQ (unpenalised it saturates
    tanh and uses two levels per channel), and --discrete variants get the same."""
    cfg = get_tokenizer_config("tok-tiny-discrete")
    assert (cfg.regulariser, cfg.reg_weight) == ("l2", 1e-3)
    assert discrete_variant(TokenizerConfig(), (8, 5, 5, 5)).regulariser == "l2"
    torch.manual_seed(0)
    model = CausalVideoAutoencoder(cfg)
    x = torch.rand(1, 3, 5, 32, 32) * 2 - 1
    out = model(x)
    assert out.reg.item() == pytest.approx(model.encoder(x).square().mean().item(), rel=1e-5)
    assert out.reg.requires_grad  # it trains the encoder


def test_tiny_discrete_tokenizer_matches_ar_tiny_vocabulary():
    """tok-tiny-discrete's ids are ar-tiny's vocabulary (and the synthetic tokens' grid); a
    continuous tokenizer has none."""
    from vfm_core.recipes import get_recipe
    from vfm_core.tokenizer.synthetic_tokens import synthetic_levels

    tok = get_tokenizer_config("tok-tiny-discrete")
    model = get_recipe("ar-tiny").model
    assert tok.vocab_size == model.vocab_size == 256
    assert synthetic_levels(model) == tok.fsq_levels
    assert TokenizerConfig().vocab_size == 0
