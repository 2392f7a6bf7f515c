"""Golden tests of the EDM sampler (Karras et al. 2022, eq. 5 and Algorithm 1) and of CFG.

Exactness test: for data ~ N(0, s^2) per element the ideal denoiser is D(x; sigma) =
x s^2 / (s^2 + sigma^2), so the probability-flow ODE dx/dsigma = (x - D) / sigma = x sigma /
(s^2 + sigma^2) has the closed-form solution x(sigma) = x(sigma_max) sqrt(s^2 + sigma^2) /
sqrt(s^2 + sigma_max^2).
"""

from __future__ import annotations

import math

import pytest
import torch

from vfm_core.config import DiffusionConfig
from vfm_core.diffusion.edm import EDM, karras_sigmas
from vfm_core.diffusion.sampler import guided, sample, sample_from_config

S = 0.5  # data std of the Gaussian toy problem
SHAPE = (2, 3, 2, 4, 4)  # (B, C, T, H, W)


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _b(v: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    v = torch.as_tensor(v, dtype=x.dtype)
    return v.view(-1, *([1] * (x.ndim - 1))) if v.ndim else v


def gauss_denoiser(x, sigma, text=None):
    """Ideal denoiser for data ~ N(0, S^2): D = x S^2 / (S^2 + sigma^2)."""
    return x * S**2 / (S**2 + _b(sigma, x) ** 2)


def exact(noise: torch.Tensor, sigma_max: float, sigma: float = 0.0) -> torch.Tensor:
    x_max = noise * sigma_max
    return x_max * math.sqrt(S**2 + sigma**2) / math.sqrt(S**2 + sigma_max**2)


def _schedule(n: int) -> torch.Tensor:
    return karras_sigmas(n, sigma_min=0.002, sigma_max=80.0, rho=7.0, dtype=torch.float64)


def _rel_err(out: torch.Tensor, want: torch.Tensor) -> float:
    return ((out - want) / want).abs().max().item()


# ---------------------------------------------------------------------------- schedule (eq. 5)
def test_karras_sigmas_endpoints_monotone_and_eq5() -> None:
    sig = karras_sigmas(32, sigma_min=0.002, sigma_max=80.0, rho=7.0, dtype=torch.float64)
    assert sig.shape == (33,)
    assert sig[0].item() == pytest.approx(80.0, rel=1e-12)
    assert sig[31].item() == pytest.approx(0.002, rel=1e-12)
    assert sig[32].item() == 0.0
    assert (sig[1:] < sig[:-1]).all()
    # eq. 5 by hand at i = 16, N = 32: (80^(1/7) + 16/31 (0.002^(1/7) - 80^(1/7)))^7
    hi, lo = 80.0 ** (1 / 7), 0.002 ** (1 / 7)
    assert sig[16].item() == pytest.approx((hi + 16 / 31 * (lo - hi)) ** 7, rel=1e-12)
    # the same as a plain decimal: 80^(1/7) = 1.87012225, 0.002^(1/7) = 0.41155971
    assert sig[16].item() == pytest.approx(2.17385980, rel=1e-8)


def test_karras_sigmas_dtype_device_and_one_step() -> None:
    sig = karras_sigmas(4, sigma_min=0.1, sigma_max=10.0, rho=3.0, device="cpu")
    assert sig.dtype == torch.float32 and sig.device.type == "cpu"
    # rho = 3, N = 4, i = 1: (10^(1/3) + 1/3 (0.1^(1/3) - 10^(1/3)))^3
    want = (10 ** (1 / 3) + (0.1 ** (1 / 3) - 10 ** (1 / 3)) / 3) ** 3
    assert sig[1].item() == pytest.approx(want, rel=1e-6)
    one = karras_sigmas(1, sigma_min=0.1, sigma_max=10.0, rho=7.0)
    assert one.tolist() == [10.0, 0.0]


# ---------------------------------------------------------------------------- Algorithm 1
def test_heun_lands_on_exact_ode_solution_and_beats_euler() -> None:
    noise = torch.randn(SHAPE, generator=_gen(0), dtype=torch.float64)
    errs = {}
    for n in (32, 64, 128):
        sig = _schedule(n)
        want = exact(noise, sig[0].item())
        for method in ("heun", "euler"):
            out = sample(gauss_denoiser, noise, sigmas=sig, method=method, text=None)
            assert out.shape == SHAPE and out.dtype == torch.float64
            errs[method, n] = _rel_err(out, want)
    # measured: heun 1.57e-2 / 3.66e-3 / 8.8e-4, euler 8.8e-2 / 4.4e-2 / 2.2e-2
    assert errs["heun", 32] < 2e-2
    assert errs["heun", 128] < 1e-3
    for n in (32, 64, 128):
        assert errs["euler", n] > 5 * errs["heun", n]
    # convergence order: Heun is 2nd order (error / 4 per doubling), Euler 1st order (/ 2)
    for n in (32, 64):
        assert 3.5 < errs["heun", n] / errs["heun", 2 * n] < 4.5
        assert 1.8 < errs["euler", n] / errs["euler", 2 * n] < 2.2


def test_intermediate_sigma_matches_exact_solution() -> None:
    # stop at a positive sigma (sigmas need not end in 0): the Heun correction is used on every step
    noise = torch.randn(SHAPE, generator=_gen(1), dtype=torch.float64)
    sig = torch.linspace(5.0, 0.5, 201, dtype=torch.float64)
    out = sample(gauss_denoiser, noise, sigmas=sig, method="heun", text=None)
    assert _rel_err(out, exact(noise, 5.0, 0.5)) < 1e-4  # measured 6.4e-5


def _one_heun_step(x, s0, s1, d_fn, *, buggy: bool):
    d0 = (x - d_fn(x, s0)) / s0
    x1 = x + (s1 - s0) * d0
    # Alg. 1 line 10 evaluates D at the NEXT point and the NEXT sigma; the buggy variant uses s0
    d1 = (x1 - d_fn(x1, s0 if buggy else s1)) / s1
    return x + (s1 - s0) * (d0 + d1) / 2


def test_single_heun_step_evaluates_correction_at_next_sigma() -> None:
    noise = torch.randn(SHAPE, generator=_gen(2), dtype=torch.float64)
    s0, s1 = 2.0, 0.6
    sig = torch.tensor([s0, s1], dtype=torch.float64)
    calls = []

    def rec(x, sigma, text):
        calls.append(sigma.clone())
        return gauss_denoiser(x, sigma)

    out = sample(rec, noise, sigmas=sig, method="heun", text=None)
    x = noise * s0
    right = _one_heun_step(x, s0, s1, gauss_denoiser, buggy=False)
    wrong = _one_heun_step(x, s0, s1, gauss_denoiser, buggy=True)
    torch.testing.assert_close(out, right, rtol=1e-12, atol=1e-12)
    # the buggy variant is materially different (relative ~0.6 here) ...
    assert _rel_err(wrong, right) > 0.1
    # ... and D saw exactly [s0, s1] as (B,) tensors
    assert len(calls) == 2
    assert all(c.shape == (SHAPE[0],) for c in calls)
    assert [c[0].item() for c in calls] == [s0, s1]
    # hand value: with k(s) = S^2/(S^2+s^2): d0 = x (1-k0)/s0, x1 = x + (s1-s0) d0, etc.
    k0, k1 = S**2 / (S**2 + s0**2), S**2 / (S**2 + s1**2)
    d0 = (1 - k0) / s0
    f1 = 1 + (s1 - s0) * d0
    d1 = f1 * (1 - k1) / s1
    torch.testing.assert_close(out, x * (1 + (s1 - s0) * (d0 + d1) / 2))


def test_euler_step_and_last_step_to_zero() -> None:
    noise = torch.randn(SHAPE, generator=_gen(3), dtype=torch.float64)
    # the last step to sigma = 0 is plain Euler in both methods and returns D(x; sigma_last)
    n_calls = []

    def rec(x, sigma, text):
        n_calls.append(1)
        return gauss_denoiser(x, sigma)

    for method in ("heun", "euler"):
        n_calls.clear()
        sig = torch.tensor([1.5, 0.0], dtype=torch.float64)
        out = sample(rec, noise, sigmas=sig, method=method, text=None)
        torch.testing.assert_close(out, gauss_denoiser(noise * 1.5, 1.5))
        assert len(n_calls) == 1
    sig = torch.tensor([2.0, 0.6], dtype=torch.float64)
    out = sample(gauss_denoiser, noise, sigmas=sig, method="euler", text=None)
    x = noise * 2.0
    torch.testing.assert_close(out, x + (0.6 - 2.0) * (x - gauss_denoiser(x, 2.0)) / 2.0)


def test_number_of_evaluations() -> None:
    noise = torch.randn(SHAPE, generator=_gen(4))
    sig = karras_sigmas(6, sigma_min=0.002, sigma_max=80.0, rho=7.0)
    calls = []

    def rec(x, sigma, text):
        calls.append(1)
        return gauss_denoiser(x, sigma)

    for method, want in (("heun", 2 * 6 - 1), ("euler", 6)):
        calls.clear()
        sample(rec, noise, sigmas=sig, method=method, text=None)
        assert len(calls) == want


# ---------------------------------------------------------------------------- CFG
def text_denoiser(x, sigma, text):
    """A denoiser whose output depends on the caption: D = x k(sigma) + sum(text) per sample."""
    return gauss_denoiser(x, sigma) + _b(text.sum(dim=(1, 2)), x)


def _texts(b: int = SHAPE[0]):
    text = torch.randn(b, 5, 8, generator=_gen(10), dtype=torch.float64)
    null = torch.zeros(b, 5, 8, dtype=torch.float64) - 0.1
    return text, null


def test_guided_formula_and_single_batched_call() -> None:
    text, null = _texts()
    x = torch.randn(SHAPE, generator=_gen(11), dtype=torch.float64)
    sigma = torch.tensor([0.7, 3.0], dtype=torch.float64)
    shapes = []

    def rec(x_, s_, t_):
        shapes.append((tuple(x_.shape), tuple(s_.shape), tuple(t_.shape)))
        return text_denoiser(x_, s_, t_)

    g = 4.5
    out = guided(rec, g)(x, sigma, text, null)
    cond, uncond = text_denoiser(x, sigma, text), text_denoiser(x, sigma, null)
    torch.testing.assert_close(out, uncond + g * (cond - uncond))
    assert not torch.allclose(out, cond)
    assert shapes == [((4, *SHAPE[1:]), (4,), (4, 5, 8))]

    shapes.clear()
    torch.testing.assert_close(guided(rec, 1.0)(x, sigma, text, None), cond)
    assert shapes == [(SHAPE, (2,), (2, 5, 8))]

    # structured text (dict of tensors) is batched per key
    def rec_dict(x_, s_, t_):
        assert t_["emb"].shape == (4, 5, 8) and t_["mask"].shape == (4, 5)
        return text_denoiser(x_, s_, t_["emb"])

    mask = torch.ones(2, 5)
    out = guided(rec_dict, g)(x, sigma, {"emb": text, "mask": mask}, {"emb": null, "mask": mask})
    torch.testing.assert_close(out, uncond + g * (cond - uncond))


def test_sample_with_guidance_batches_each_step() -> None:
    text, null = _texts()
    noise = torch.randn(SHAPE, generator=_gen(12), dtype=torch.float64)
    sig = karras_sigmas(5, sigma_min=0.002, sigma_max=80.0, rho=7.0, dtype=torch.float64)
    g = 3.0
    batches = []

    def rec(x_, s_, t_):
        batches.append((x_.shape[0], s_.shape[0], t_.shape[0]))
        return text_denoiser(x_, s_, t_)

    out = sample(rec, noise, sigmas=sig, text=text, null_text=null, guidance=g)
    assert batches == [(4, 4, 4)] * (2 * 5 - 1)  # one 2B call per evaluation, Heun: 2N - 1

    # same result as a denoiser that mixes two separate calls by hand
    def mixed(x_, s_, t_):
        c, u = text_denoiser(x_, s_, text), text_denoiser(x_, s_, null)
        return u + g * (c - u)

    torch.testing.assert_close(out, sample(mixed, noise, sigmas=sig, text=text))

    batches.clear()
    plain = sample(rec, noise, sigmas=sig, text=text, guidance=1.0)
    assert batches == [(2, 2, 2)] * (2 * 5 - 1)
    torch.testing.assert_close(plain, sample(text_denoiser, noise, sigmas=sig, text=text))
    assert not torch.allclose(plain, out)


# ---------------------------------------------------------------------------- from config
def test_sample_from_config_uses_edm_denoise_and_schedule() -> None:
    cfg = DiffusionConfig(sigma_data=S, num_steps=40, sampler="heun")
    edm = EDM(cfg)

    def ideal_net(x_in, c_noise, text):
        # raw net that makes edm.denoise the Gaussian ideal denoiser (sigma_data = S): D = c_skip x
        return torch.zeros_like(x_in)

    noise = torch.randn(SHAPE, generator=_gen(13), dtype=torch.float64)
    out = sample_from_config(edm, ideal_net, noise, cfg, text=None, progress=True)
    # with sigma_data = S, c_skip x is exactly the ideal denoiser for N(0, S^2)
    want = sample(gauss_denoiser, noise, sigmas=_schedule(40).float(), text=None)
    torch.testing.assert_close(out, want)
    assert _rel_err(out, exact(noise, 80.0)) < 1.5e-2

    euler = sample_from_config(edm, ideal_net, noise, DiffusionConfig(sampler="euler"), text=None)
    assert _rel_err(euler, exact(noise, 80.0)) > 5 * _rel_err(out, exact(noise, 80.0))


# ---------------------------------------------------------------------------- bad input
def test_bad_inputs_raise_value_error() -> None:
    noise = torch.zeros(SHAPE)
    sig = karras_sigmas(4, sigma_min=0.002, sigma_max=80.0, rho=7.0)
    with pytest.raises(ValueError, match="method"):
        sample(gauss_denoiser, noise, sigmas=sig, method="dpm", text=None)  # type: ignore[arg-type]
    for n in (0, -3):
        with pytest.raises(ValueError, match="num_steps"):
            karras_sigmas(n, sigma_min=0.002, sigma_max=80.0, rho=7.0)
    with pytest.raises(ValueError, match="num_steps"):
        sample_from_config(
            EDM(DiffusionConfig()), None, noise, DiffusionConfig(num_steps=0), text=None
        )
    with pytest.raises(ValueError, match="sigmas"):
        sample(gauss_denoiser, noise, sigmas=torch.tensor([1.0]), text=None)
    with pytest.raises(ValueError, match="sigmas"):
        sample(gauss_denoiser, noise, sigmas=torch.tensor([1.0, 2.0, 0.0]), text=None)
    with pytest.raises(ValueError, match="sigma_min"):
        karras_sigmas(4, sigma_min=0.0, sigma_max=80.0, rho=7.0)
    with pytest.raises(ValueError, match="rho"):
        karras_sigmas(4, sigma_min=0.1, sigma_max=80.0, rho=0.0)
    with pytest.raises(ValueError, match="null_text"):
        sample(gauss_denoiser, noise, sigmas=sig, text=torch.zeros(2, 1, 1), guidance=2.0)
