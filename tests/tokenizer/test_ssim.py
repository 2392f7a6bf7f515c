"""SSIM of reconstructions (Wang et al. 2004): 1 for identical videos, lower with noise, near 0
for a flat prediction of a textured clip; the tokenizer evaluation reports it with its baseline."""

from __future__ import annotations

import pytest
import torch

from vfm_core.tokenizer import CausalVideoAutoencoder, TokenizerConfig
from vfm_core.tokenizer.autoencoder import ssim_sum
from vfm_core.tokenizer.train import evaluate_reconstruction, synthetic_clips


def test_ssim_orders_reconstructions():
    g = torch.Generator().manual_seed(0)
    x = torch.rand(2, 3, 3, 32, 32, generator=g) * 2 - 1  # (B, 3, T, H, W)
    same, n = ssim_sum(x, x)
    assert n == 6 and same / n == pytest.approx(1.0)
    noisy = ssim_sum(x + 0.1 * torch.randn(x.shape, generator=g), x)[0] / n
    flat = ssim_sum(torch.zeros_like(x), x)[0] / n
    assert 1.0 > noisy > 0.5 > 0.1 > flat
    tiny = x[..., :5, :5]  # smaller than the 11 x 11 window
    assert ssim_sum(tiny, tiny)[0] / n == pytest.approx(1.0)


def test_evaluate_reconstruction_reports_ssim_with_baseline():
    torch.manual_seed(0)
    model = CausalVideoAutoencoder(TokenizerConfig(base_channels=8))
    clips = synthetic_clips(2, frames=5, size=16, seed=1)  # (2, 3, 5, 16, 16)
    r = evaluate_reconstruction(model, [clips])
    assert set(r) == {"psnr", "baseline_psnr", "ssim", "baseline_ssim"}
    assert -1 <= r["ssim"] <= 1 and -1 <= r["baseline_ssim"] <= 1
