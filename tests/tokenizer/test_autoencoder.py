"""Causal video autoencoder: shapes, causality, image = one-frame video, tiling, latent scaling."""

from __future__ import annotations

import pytest
import torch

from vfm_core.config import ConfigError
from vfm_core.tokenizer import (
    CausalVideoAutoencoder,
    TokenizerConfig,
    TokenizerConfigError,
    TokenizerShapeError,
    compute_latent_stats,
    get_tokenizer_config,
)

# small and fast: 4x8x8 compression as tok-tiny, narrower
SMALL = dict(base_channels=16, norm_groups=8)


def make(**kw) -> CausalVideoAutoencoder:
    torch.manual_seed(0)
    return CausalVideoAutoencoder(TokenizerConfig(**{**SMALL, **kw})).eval()


@pytest.fixture(scope="module")
def model() -> CausalVideoAutoencoder:
    return make()


@pytest.mark.parametrize("frames", [1, 5, 9, 17])
def test_shapes(model, frames):
    x = torch.rand(2, 3, frames, 32, 48) * 2 - 1  # (B, 3, T, H, W)
    with torch.no_grad():
        z = model.encode(x)
        y = model.decode(z)
    k = (frames - 1) // 4
    assert z.shape == (2, 4, 1 + k, 4, 6)
    assert model.latent_shape(frames, 32, 48) == (4, 1 + k, 4, 6)
    assert y.shape == x.shape
    assert model.frames_for_latent(1 + k) == frames


@pytest.mark.parametrize(
    "kw",
    [
        dict(temporal_factor=8, channel_mult=(1, 2, 2)),
        dict(temporal_factor=1, patch_t=1),
        dict(spatial_factor=16, channel_mult=(1, 2, 2)),
        dict(patch_t=1, patch_s=1, channel_mult=(1, 1, 2, 2)),
        dict(regulariser="kl"),
    ],
)
def test_other_compressions(kw):
    m = make(**kw)
    t, s = m.cfg.temporal_factor, m.cfg.spatial_factor
    x = torch.randn(1, 3, 1 + 2 * t, 32, 32)  # (B, 3, 1 + 2t, H, W)
    with torch.no_grad():
        z = m.encode(x)
        assert z.shape == (1, 4, 3, 32 // s, 32 // s)
        assert m.decode(z).shape == x.shape


@pytest.mark.parametrize(
    ("shape", "match"),
    [
        ((1, 3, 4, 32, 32), r"4 frames; the tokenizer takes 1 \+ 4·k frames \(e.g. 1 or 5\)"),
        ((1, 3, 10, 32, 32), r"10 frames.*e.g. 9 or 13"),
        ((1, 3, 5, 30, 32), "multiples of the spatial factor 8"),
        ((1, 3, 5, 32, 4), "multiples of the spatial factor 8"),
        ((1, 1, 5, 32, 32), "1 channels"),
        ((1, 3, 32, 32), r"\(B, 3, T, H, W\).*unsqueeze"),
    ],
)
def test_bad_shapes_raise_clear_error(model, shape, match):
    with pytest.raises(TokenizerShapeError, match=match) as e:
        model.encode(torch.zeros(shape))
    assert str(tuple(shape)) in str(e.value)


def test_bad_latent_and_config():
    m = make()
    with pytest.raises(TokenizerShapeError, match="4 latent channels"):
        m.decode(torch.zeros(1, 16, 2, 4, 4))
    with pytest.raises(TokenizerConfigError, match="temporal_factor"):
        TokenizerConfig(temporal_factor=3)
    with pytest.raises(TokenizerConfigError, match="channel_mult needs 3"):
        TokenizerConfig(temporal_factor=8)
    with pytest.raises(TokenizerConfigError, match="shortcuts: stage 1 width 96 must divide"):
        TokenizerConfig(channel_mult=(1, 3))
    with pytest.raises(TokenizerConfigError, match="patch_t must be a power of two dividing"):
        TokenizerConfig(temporal_factor=1)
    # the one settings builder: the key named with its section, the known keys listed
    with pytest.raises(ConfigError, match=r"tokenizer.latent_chanels: unknown key \(known: "):
        TokenizerConfig.from_dict({"latent_chanels": 4})
    with pytest.raises(ConfigError, match=r"tokenizer.channel_mult\[1\]: expected an integer"):
        TokenizerConfig.from_dict({"channel_mult": [1, "2"]})
    with pytest.raises(TokenizerConfigError, match="known"):
        get_tokenizer_config("nope")


def test_causality_and_image_equals_first_frame(model):
    torch.manual_seed(1)
    x = torch.randn(1, 3, 13, 32, 32)  # (B, 3, 1 + 4·3, H, W)
    with torch.no_grad():
        z = model.encode(x)  # (1, 4, 4, 4, 4)
        for t in (12, 9, 5):  # changing frame t leaves latent frames before ceil(t/4) unchanged
            x2 = x.clone()
            x2[:, :, t] += 1.0
            z2 = model.encode(x2)
            j = (t + 3) // 4  # the latent frame that first sees pixel frame t
            assert torch.equal(z2[:, :, :j], z[:, :, :j])
            assert not torch.allclose(z2[:, :, j], z[:, :, j])
        image = model.encode(x[:, :, :1])  # an image is a one-frame video
        torch.testing.assert_close(image, z[:, :, :1], rtol=0, atol=1e-5)
        # decoding is causal too: the first decoded frame only depends on the first latent frame
        y = model.decode(z)
        y0 = model.decode(z[:, :, :1])
        torch.testing.assert_close(y0, y[:, :, :1], rtol=0, atol=1e-5)


@pytest.mark.parametrize("tile", [1, 2, 3])
def test_tiled_equals_untiled(model, tile):
    """Tiling rule: first tile 1 + 4n frames, then 4n frames, causal state carried (tol 1e-5)."""
    torch.manual_seed(2)
    x = torch.randn(1, 3, 25, 32, 32)  # (B, 3, 1 + 4·6, H, W)
    with torch.no_grad():
        z = model.encode(x, tile_latent_frames=0)
        zt = model.encode(x, tile_latent_frames=tile)
        y = model.decode(z, tile_latent_frames=0)
        yt = model.decode(z, tile_latent_frames=tile)
    torch.testing.assert_close(zt, z, rtol=0, atol=1e-5)
    torch.testing.assert_close(yt, y, rtol=0, atol=1e-5)


def test_tiling_without_carried_state_would_differ(model):
    """Sanity check that the tiling test is sensitive: restarting each tile changes results."""
    x = torch.randn(1, 3, 9, 32, 32)
    with torch.no_grad():
        whole = model.encode(x)
        naive = torch.cat([model.encode(x[:, :, :5]), model.encode(x[:, :, 4:])[:, :, 1:]], 2)
    assert not torch.allclose(naive, whole, atol=1e-4)


def test_latent_stats_normalise():
    m = make()
    clips = [torch.rand(2, 3, 5, 32, 32) * 2 - 1 for _ in range(3)]
    mean, std = compute_latent_stats(m, clips)
    assert mean.shape == std.shape == (4,)
    m.set_latent_stats(mean, std)
    with torch.no_grad():
        z = torch.cat([m.encode(c) for c in clips])  # (6, 4, 2, 4, 4)
        raw = torch.cat([m.encode(c, normalize=False) for c in clips])
        torch.testing.assert_close(z.mean(dim=(0, 2, 3, 4)), torch.zeros(4), atol=1e-4, rtol=0)
        torch.testing.assert_close(
            z.std(dim=(0, 2, 3, 4), unbiased=False), torch.ones(4), atol=1e-3, rtol=0
        )
        torch.testing.assert_close(m.denormalize(z), raw, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(m.decode(z), m.decode(raw, normalized=False))
    with pytest.raises(TokenizerShapeError, match="4 channels"):
        m.set_latent_stats(torch.zeros(3), torch.ones(3))


def test_presets_build_on_meta():
    for name, c in [("tok-4x8x8", (4, 8)), ("tok-8x8x8", (8, 8)), ("tok-8x16x16", (8, 16))]:
        cfg = get_tokenizer_config(name)
        assert (cfg.temporal_factor, cfg.spatial_factor) == c
        with torch.device("meta"):
            m = CausalVideoAutoencoder(cfg)
        assert m.latent_shape(121, 704, 1280)[1] == 1 + 120 // c[0]
