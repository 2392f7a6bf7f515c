"""Golden tests of the EDM training side against values hand-computed from Karras et al. 2022.

EDM Table 1 ("Ours"): c_skip = sd^2/(s^2+sd^2), c_out = s*sd/sqrt(s^2+sd^2),
c_in = 1/sqrt(s^2+sd^2), c_noise = ln(s)/4, lambda = (s^2+sd^2)/(s*sd)^2,
ln(s) ~ N(P_mean, P_std^2).
"""

from __future__ import annotations

import math

import pytest
import torch

from vfm_core.config import DiffusionConfig
from vfm_core.diffusion.edm import EDM, scale_latents, unscale_latents
from vfm_core.diffusion.objective import create_diffusion

SHAPE = (3, 4, 2, 6, 5)  # (B, C, T, H, W)


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def zero_net(x_in, c_noise, text):
    return torch.zeros_like(x_in)


# (sigma, c_skip, c_out, c_in, c_noise, lambda) for sigma_data = 0.5, worked out by hand:
#   sigma = 0.5:   s^2 + sd^2 = 0.5;      lambda = 0.5 / 0.25^2 = 8
#   sigma = 2.0:   s^2 + sd^2 = 4.25;     c_out = 2 * 0.5 / sqrt(4.25) = c_in;  lambda = 4.25 / 1
#   sigma = 0.002: s^2 + sd^2 = 0.250004; lambda = 0.250004 / 0.001^2 = 250004
GOLDEN = [
    (0.5, 0.5, 0.25 / math.sqrt(0.5), 1 / math.sqrt(0.5), math.log(0.5) / 4, 8.0),
    (2.0, 1 / 17, 1 / math.sqrt(4.25), 1 / math.sqrt(4.25), math.log(2.0) / 4, 4.25),
    (
        0.002,
        0.25 / 0.250004,
        0.001 / math.sqrt(0.250004),
        1 / math.sqrt(0.250004),
        math.log(0.002) / 4,
        250004.0,
    ),
]


def test_golden_literals_are_what_we_think() -> None:
    # guard the table itself with plain decimal literals
    assert GOLDEN[0][2] == pytest.approx(0.35355339059327373, rel=1e-15)
    assert GOLDEN[0][3] == pytest.approx(1.4142135623730951, rel=1e-15)
    assert GOLDEN[0][4] == pytest.approx(-0.17328679513998632, rel=1e-15)
    assert GOLDEN[1][1] == pytest.approx(0.058823529411764705, rel=1e-15)
    assert GOLDEN[1][2] == pytest.approx(0.48507125007266594, rel=1e-15)
    assert GOLDEN[2][4] == pytest.approx(-1.5536520246055479, rel=1e-15)


@pytest.mark.parametrize(("sigma", "c_skip", "c_out", "c_in", "c_noise", "lam"), GOLDEN)
def test_precondition_matches_table1(sigma, c_skip, c_out, c_in, c_noise, lam) -> None:
    edm = EDM(DiffusionConfig(sigma_data=0.5))
    s = torch.tensor([sigma], dtype=torch.float64)
    got = edm.precondition(s)
    for value, want in zip(got, (c_skip, c_out, c_in, c_noise), strict=True):
        assert value.shape == (1,)
        assert value.item() == pytest.approx(want, rel=1e-12)
    assert edm.loss_weight(s).item() == pytest.approx(lam, rel=1e-12)


def test_precondition_other_sigma_data_and_batch() -> None:
    sd = 1.3
    edm = EDM(DiffusionConfig(sigma_data=sd))
    sig = [0.01, 0.7, 1.3, 55.0]
    c_skip, c_out, c_in, c_noise = edm.precondition(torch.tensor(sig, dtype=torch.float64))
    for i, s in enumerate(sig):
        assert c_skip[i].item() == pytest.approx(sd**2 / (s**2 + sd**2), rel=1e-12)
        assert c_out[i].item() == pytest.approx(s * sd / math.sqrt(s**2 + sd**2), rel=1e-12)
        assert c_in[i].item() == pytest.approx(1 / math.sqrt(s**2 + sd**2), rel=1e-12)
        assert c_noise[i].item() == pytest.approx(math.log(s) / 4, rel=1e-12)
    # sigma = sigma_data: c_skip = 1/2 exactly
    assert c_skip[2].item() == pytest.approx(0.5, rel=1e-12)
    # EDM eq. 8 / Sec. 5: lambda(sigma) * c_out(sigma)^2 = 1 (uniform effective weight on F)
    lam = edm.loss_weight(torch.tensor(sig, dtype=torch.float64))
    torch.testing.assert_close(lam * c_out**2, torch.ones(4, dtype=torch.float64))
    # unit-variance network input: c_in^2 (sigma^2 + sd^2) = 1
    var = torch.tensor(sig, dtype=torch.float64) ** 2 + sd**2
    torch.testing.assert_close(c_in**2 * var, torch.ones(4, dtype=torch.float64))


def test_precondition_float32_for_low_precision_sigma() -> None:
    edm = create_diffusion(DiffusionConfig())
    for c in edm.precondition(torch.tensor([0.5, 2.0], dtype=torch.bfloat16)):
        assert c.dtype == torch.float32
    assert edm.loss_weight(torch.tensor([0.5], dtype=torch.bfloat16)).dtype == torch.float32


def test_denoise_zero_net_is_c_skip_x_and_net_sees_preconditioned_input() -> None:
    edm = EDM(DiffusionConfig(sigma_data=0.5))
    x = torch.randn(SHAPE, generator=_gen(0))
    sigma = torch.tensor([0.5, 2.0, 0.002])
    text = torch.randn(3, 7, 16, generator=_gen(1))
    seen = {}

    def net(x_in, c_noise, t):
        seen.update(x_in=x_in, c_noise=c_noise, text=t)
        return torch.zeros_like(x_in)

    out = edm.denoise(net, x, sigma, text)
    c_skip = torch.tensor([g[1] for g in GOLDEN])
    c_in = torch.tensor([g[3] for g in GOLDEN])
    c_noise = torch.tensor([g[4] for g in GOLDEN])
    torch.testing.assert_close(out, c_skip.view(3, 1, 1, 1, 1) * x)
    torch.testing.assert_close(seen["x_in"], c_in.view(3, 1, 1, 1, 1) * x)
    torch.testing.assert_close(seen["c_noise"], c_noise)
    assert seen["c_noise"].shape == (3,)
    assert seen["text"] is text  # passed through untouched


def test_denoise_adds_c_out_times_net_output() -> None:
    edm = EDM(DiffusionConfig(sigma_data=0.5))
    x = torch.randn(2, 5, generator=_gen(2))  # any shape with a leading batch dim
    sigma = torch.tensor([0.5, 2.0])
    f = torch.randn(2, 5, generator=_gen(3))
    out = edm.denoise(lambda x_in, c, t: f, x, sigma, None)
    c_skip = torch.tensor([[0.5], [1 / 17]])
    c_out = torch.tensor([[0.25 / math.sqrt(0.5)], [1 / math.sqrt(4.25)]])
    torch.testing.assert_close(out, c_skip * x + c_out * f)
    # a scalar sigma is broadcast over the batch
    torch.testing.assert_close(
        edm.denoise(lambda x_in, c, t: f, x, 2.0, None), (1 / 17) * x + c_out[1] * f
    )


def test_denoise_rejects_wrong_sigma_and_output_shapes() -> None:
    edm = create_diffusion()
    x = torch.zeros(2, 3)
    with pytest.raises(ValueError, match="sigma"):
        edm.denoise(zero_net, x, torch.ones(3), None)
    with pytest.raises(ValueError, match="net output"):
        edm.denoise(lambda x_in, c, t: torch.zeros(2, 4), x, torch.ones(2), None)


def test_ideal_net_for_single_point_dataset_has_zero_loss() -> None:
    # all data equal to the constant a => the optimal denoiser is D(x; sigma) = a, i.e. the raw
    # network must output F = (a - c_skip x) / c_out (invert EDM eq. 7)
    sd, a = 0.5, 0.37
    edm = EDM(DiffusionConfig(sigma_data=sd))

    def ideal(x_in, c_noise, text):
        sigma = (4 * c_noise).exp().view(-1, 1, 1, 1, 1)  # c_noise = ln(sigma) / 4
        x = x_in * (sigma**2 + sd**2).sqrt()  # undo c_in
        c_skip = sd**2 / (sigma**2 + sd**2)
        c_out = sigma * sd / (sigma**2 + sd**2).sqrt()
        return (a - c_skip * x) / c_out

    x0 = torch.full(SHAPE, a, dtype=torch.float64)
    noise = torch.randn(SHAPE, generator=_gen(4), dtype=torch.float64)
    sigma = torch.tensor([0.01, 1.0, 60.0], dtype=torch.float64)
    loss = edm.loss(ideal, x0, None, sigma=sigma, noise=noise)
    assert loss.shape == (3,)
    torch.testing.assert_close(loss, torch.zeros(3, dtype=torch.float64), atol=1e-18, rtol=0)
    # ... and any other net is penalised
    assert (edm.loss(zero_net, x0, None, sigma=sigma, noise=noise) > 1e-3).all()


def test_loss_hand_value_and_formula() -> None:
    edm = EDM(DiffusionConfig(sigma_data=0.5))
    # x0 = 0, noise = 1, sigma = 0.5, F = 0: D = c_skip * 0.5 = 0.25; err^2 = 0.0625;
    # lambda = 8  =>  loss = 0.5
    x0 = torch.zeros(1, 2, 1, 2, 2)
    loss = edm.loss(zero_net, x0, None, sigma=torch.tensor([0.5]), noise=torch.ones_like(x0))
    assert loss.item() == pytest.approx(0.5, rel=1e-6)

    x0 = torch.randn(SHAPE, generator=_gen(5))
    noise = torch.randn(SHAPE, generator=_gen(6))
    sigma = torch.tensor([0.5, 2.0, 0.002])
    f = torch.randn(SHAPE, generator=_gen(7))
    loss = edm.loss(lambda x_in, c, t: f, x0, None, sigma=sigma, noise=noise)
    want = []
    for i, (s, c_skip, c_out, _, _, lam) in enumerate(GOLDEN):
        d = c_skip * (x0[i] + s * noise[i]) + c_out * f[i]
        want.append(lam * ((d - x0[i]) ** 2).mean())
    torch.testing.assert_close(loss, torch.stack(want))


def test_loss_rejects_mismatched_noise() -> None:
    edm = create_diffusion()
    with pytest.raises(ValueError, match="noise"):
        edm.loss(zero_net, torch.zeros(2, 3), None, sigma=torch.ones(2), noise=torch.zeros(2, 4))


def test_training_losses_deterministic_given_seed() -> None:
    edm = create_diffusion(DiffusionConfig())
    x0 = torch.randn(SHAPE, generator=_gen(8))
    w = torch.randn(SHAPE[1:], generator=_gen(9))
    net = lambda x_in, c, t: x_in * w + c.view(-1, 1, 1, 1, 1)
    l1, s1 = edm.training_losses(net, x0, None, generator=_gen(123))
    l2, s2 = edm.training_losses(net, x0, None, generator=_gen(123))
    l3, s3 = edm.training_losses(net, x0, None, generator=_gen(124))
    assert l1.shape == s1.shape == (3,)
    assert torch.equal(l1, l2) and torch.equal(s1, s2)
    assert not torch.equal(s1, s3) and not torch.equal(l1, l3)
    # documented draw order: sigma (B,) first, then noise like x0, from the same generator
    g = _gen(123)
    sigma = edm.sample_sigma(3, generator=g)
    noise = torch.randn(SHAPE, generator=g)
    torch.testing.assert_close(s1, sigma, rtol=0, atol=0)
    torch.testing.assert_close(l1, edm.loss(net, x0, None, sigma=sigma, noise=noise))


def test_sample_sigma_is_lognormal_with_p_mean_p_std() -> None:
    edm = EDM(DiffusionConfig(p_mean=-1.2, p_std=1.2))
    sigma = edm.sample_sigma(100_000, generator=_gen(0), device="cpu")
    assert sigma.shape == (100_000,) and (sigma > 0).all()
    log = sigma.double().log()
    # standard error of the mean is 1.2 / sqrt(1e5) ~ 0.004
    assert log.mean().item() == pytest.approx(-1.2, abs=0.02)
    assert log.std().item() == pytest.approx(1.2, abs=0.02)
    # a different config really changes the distribution
    other = EDM(DiffusionConfig(p_mean=0.4, p_std=0.3)).sample_sigma(100_000, generator=_gen(0))
    assert other.log().mean().item() == pytest.approx(0.4, abs=0.01)
    assert other.log().std().item() == pytest.approx(0.3, abs=0.01)
    # same generator seed -> same draws
    assert torch.equal(sigma, edm.sample_sigma(100_000, generator=_gen(0)))


def test_scale_latents_round_trip_and_hand_values() -> None:
    z = torch.tensor([[1.0, 3.0, 5.0]])
    # (z - 3) / 2 * 0.5
    torch.testing.assert_close(
        scale_latents(z, 3.0, 2.0, sigma_data=0.5), torch.tensor([[-0.5, 0.0, 0.5]])
    )
    edm = EDM(DiffusionConfig(sigma_data=0.25))
    torch.testing.assert_close(edm.scale_latents(z, 3.0, 2.0), torch.tensor([[-0.25, 0.0, 0.25]]))
    zz = torch.randn(2, 4, 3, 5, 5, generator=_gen(10)) * 3 + 1
    mean = torch.randn(1, 4, 1, 1, 1, generator=_gen(11))
    std = torch.rand(1, 4, 1, 1, 1, generator=_gen(12)) + 0.5
    torch.testing.assert_close(edm.unscale_latents(edm.scale_latents(zz, mean, std), mean, std), zz)
    torch.testing.assert_close(
        unscale_latents(scale_latents(zz, mean, std, sigma_data=0.7), mean, std, sigma_data=0.7),
        zz,
    )


def test_bad_config_raises() -> None:
    with pytest.raises(ValueError, match="sigma_data"):
        EDM(DiffusionConfig(sigma_data=0.0))
    with pytest.raises(ValueError, match="p_std"):
        EDM(DiffusionConfig(p_std=-1.0))
