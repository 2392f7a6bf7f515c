"""Video-to-world training of the DiT family (``diffusion.frame_cond``): a noise level per latent
frame reaches every token of that frame (the same output as one level per sample when they are
equal); a conditioned sample keeps its leading frames clean (no noise, level ``sigma_min``) and
is scored only on the others; the draws are per global sample; bad settings are one line."""

from __future__ import annotations

import pytest
import torch

from vfm_core.config import ConfigError, apply_overrides, validate
from vfm_core.families import build_model, family_of
from vfm_core.recipes import get_recipe
from vfm_core.rng import StepRNG

TINY = ["model.hidden=64", "model.depth=2", "model.text_dim=32", "data.batch_size=4"]
TINY += ["data.latent_frames=4", "data.latent_height=8", "data.latent_width=8"]


def _cfg(*extra: str):
    return validate(apply_overrides(get_recipe("dit-tiny"), [*TINY, *extra]))


@pytest.mark.parametrize("pooled", [False, True])
def test_a_noise_level_per_frame_modulates_that_frames_tokens(pooled):
    extra = ["model.text_conditioning=pooled"] if pooled else []
    model = build_model(_cfg(*extra).model, seed=0)
    with torch.no_grad():
        for p in model.parameters():  # non-zero gates: the levels reach the output
            p.add_(0.02 * torch.randn_like(p))
    g = torch.Generator().manual_seed(0)
    x, text = torch.randn(2, 4, 4, 8, 8, generator=g), torch.randn(2, 8, 32, generator=g)
    c = torch.tensor([0.3, -0.5])
    whole = model(x, c, text)
    same = model(x, c[:, None].expand(2, 4).contiguous(), text)
    torch.testing.assert_close(same, whole, rtol=1e-5, atol=1e-6)
    levels = c[:, None].repeat(1, 4)
    levels[:, 0] = -1.6  # frame 0 at another level: its output changes, and through attention
    other = model(x, levels, text)
    assert not torch.allclose(other[:, :, 0], whole[:, :, 0], atol=1e-4)
    with pytest.raises(Exception, match=r"c_noise per frame: expected \(B, 4\)"):
        model(x, levels[:, :3], text)


def _objective(cfg):
    return family_of(cfg).objective(
        cfg,
        draws=StepRNG(seed=1),
        device=torch.device("cpu"),
        local_batch=cfg.data.batch_size,
        null_text=torch.zeros(cfg.model.text_len, cfg.model.text_dim),
        null_length=1,
        tensor_parallel=False,
    )


def test_conditioned_samples_keep_clean_frames_at_their_own_level_and_unscored():
    from vfm_core.data.synthetic_latents import SyntheticLatents

    cfg = _cfg("diffusion.frame_cond=1.0", "diffusion.frame_cond_max=2")
    batch = SyntheticLatents(cfg.data, cfg.model).next_batch()
    obj = _objective(cfg)
    (mb,) = obj.microbatches(batch, step=3, weight=0.25, splits=1)
    k = StepRNG(seed=1).cond_frames(3, 4, 1.0, 2)  # the same draws: per global sample
    assert set(k.tolist()) <= {1, 2} and mb.kwargs["c_noise"].shape == (4, 4)
    c_min = obj.edm.precondition(torch.tensor(cfg.diffusion.sigma_min))
    for i, ki in enumerate(k.tolist()):
        x0 = batch.values[i]
        clean, noisy = slice(0, ki), slice(ki, None)
        torch.testing.assert_close(mb.inputs[i][:, clean], c_min[2] * x0[:, clean])
        assert torch.allclose(mb.kwargs["c_noise"][i, clean], c_min[3])
        assert not torch.allclose(mb.kwargs["c_noise"][i, noisy], c_min[3])
        assert mb.loss_mask[i, 0, :, 0, 0].tolist() == [0.0] * ki + [1.0] * (4 - ki)
    out = torch.randn_like(mb.target)
    spoiled = out.clone()
    spoiled[:, :, 0] += 100.0  # the first frame is clean in every sample: not scored
    assert torch.equal(obj.loss(out, mb), obj.loss(spoiled, mb))
    plain = _objective(_cfg())
    (ref,) = plain.microbatches(batch, step=3, weight=0.25, splits=1)
    assert ref.loss_mask is None and ref.kwargs["c_noise"].shape == (4,)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["diffusion.frame_cond=1.5"], r"diffusion.frame_cond: must be in \[0, 1\]"),
        (["diffusion.frame_cond=0.5", "diffusion.frame_cond_max=4"], "below data.latent_frames"),
        (["diffusion.frame_cond=0.5", "diffusion.frame_cond_max=0"], "must be >= 1"),
    ],
)
def test_bad_frame_conditioning_settings_are_one_line(extra, message):
    with pytest.raises(ConfigError, match=message):
        _cfg(*extra)
    with pytest.raises(ConfigError, match="for diffusion models only"):
        validate(apply_overrides(get_recipe("ar-tiny"), ["diffusion.frame_cond=0.5"]))
