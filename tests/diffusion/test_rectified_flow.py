"""Rectified flow in EDM's interface: the loss is exactly the velocity MSE on the straight path,
the denoiser is x_t - t v, the Euler sampler is the flow's Euler step (it recovers a point mass
exactly in one step), training times are logit-normal with the resolution shift, and dit-tiny
trains with it (loss falls)."""

from __future__ import annotations

import json
import math

import pytest
import torch

from vfm_core.config import DiffusionConfig, apply_overrides
from vfm_core.diffusion.objective import create_diffusion
from vfm_core.diffusion.rectified_flow import RectifiedFlow
from vfm_core.diffusion.sampler import sample
from vfm_core.recipes import get_recipe
from vfm_core.train.main import run_training

RF = DiffusionConfig(objective="rectified_flow")


def _net(seed=0):
    w = torch.randn(3, 3, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)

    def net(x_in, c_noise, text):  # a fixed nonlinear map of (x_t, t)
        return torch.tanh(torch.einsum("ij,bj...->bi...", w, x_in)) + c_noise.view(-1, 1, 1)

    return net


def test_loss_is_the_velocity_mse_and_denoiser_is_x_minus_t_v():
    rf = create_diffusion(RF)
    assert isinstance(rf, RectifiedFlow)
    g = torch.Generator().manual_seed(1)
    x0 = torch.randn(4, 3, 5, generator=g, dtype=torch.float64)
    eps = torch.randn(4, 3, 5, generator=g, dtype=torch.float64)
    t = torch.tensor([0.1, 0.4, 0.7, 0.95], dtype=torch.float64)
    sigma = t / (1 - t)
    net = _net()
    x_t = (1 - t.view(-1, 1, 1)) * x0 + t.view(-1, 1, 1) * eps
    v = net(x_t, t, None)
    want = (v - (eps - x0)).square().flatten(1).mean(1)
    got = rf.loss(net, x0, None, sigma=sigma, noise=eps)
    assert torch.allclose(got, want, rtol=1e-12, atol=1e-12)
    d = rf.denoise(net, x0 + sigma.view(-1, 1, 1) * eps, sigma, None)  # EDM variable x
    assert torch.allclose(d, x_t - t.view(-1, 1, 1) * v, atol=1e-12)


@pytest.mark.parametrize("steps,method", [(1, "euler"), (8, "euler"), (8, "heun")])
def test_sampler_recovers_a_point_mass(steps, method):
    """For data = one point x0 the true velocity is (x_t - x0) / t: the paths are straight, so
    Euler is exact with any number of steps."""
    rf = create_diffusion(RF)
    x0 = torch.tensor([[0.5, -1.0, 2.0]], dtype=torch.float64)[..., None]  # (1, 3, 1)

    def oracle(x_in, c_noise, text):
        return (x_in - x0) / c_noise.view(-1, 1, 1)  # velocity at (x_t, t)

    noise = torch.randn(1, 3, 1, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    out = sample(
        lambda x, s, tx: rf.denoise(oracle, x, s, tx),
        noise,
        text=None,
        sigmas=rf.sampling_sigmas(steps).double(),
        method=method,
    )
    assert torch.allclose(out, x0, atol=1e-6)


def test_training_times_are_logit_normal_with_the_shift():
    rf = create_diffusion(
        DiffusionConfig(objective="rectified_flow", logit_mean=0.2, logit_std=0.8, shift=3.0)
    )
    sigma = rf.sample_sigma(200_000, generator=torch.Generator().manual_seed(0))
    logit_t = sigma.log()  # logit(t) = ln(t / (1 - t)) = ln sigma
    assert logit_t.mean().item() == pytest.approx(0.2 + math.log(3.0), abs=0.01)
    assert logit_t.std().item() == pytest.approx(0.8, abs=0.01)
    s = rf.sampling_sigmas(4)
    t = s / (1 + s)
    assert t[-1] == 0 and t[0] > 0.999 and bool((t[:-1] > t[1:]).all())
    assert t[2].item() == pytest.approx(3 * 0.5 / (1 + 2 * 0.5), abs=1e-3)  # shifted midpoint


def test_dit_tiny_trains_with_rectified_flow(tmp_path):
    sets = [
        "diffusion.objective=rectified_flow",
        "data.batch_size=4",
        "model.depth=2",
        "train.steps=30",
        "optim.lr=0.002",
        "optim.warmup_steps=5",
        "tracking.mlflow=false",
    ]
    cfg = apply_overrides(get_recipe("dit-tiny"), sets)
    run_training(cfg, out_dir=tmp_path, progress=False)
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").open()]
    first = sum(r["loss"] for r in rows[:5]) / 5
    last = sum(r["loss"] for r in rows[-5:]) / 5
    assert last < 0.8 * first, (first, last)
