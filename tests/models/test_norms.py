"""The model's norms (``vfm_core.models.layers``): ``LayerNorm`` and ``RMSNorm`` equal torch's in
fp32, forward and backward, and under bf16 autocast keep the input's dtype and save only what the
fused GPU kernel saves (the input in bf16 and fp32 statistics per row), on this CPU and on CUDA
(``gpu`` marker): CUDA autocast would run ``layer_norm`` in fp32, saving an fp32 copy of the
input and returning fp32 (measured 0.26 GiB per dit-7b block at 4k tokens on an H200)."""

from __future__ import annotations

import pytest
import torch

from vfm_core.models.layers import make_norm

KINDS = ("layer", "rms")


def _reference(kind: str, dim: int, eps: float, affine: bool) -> torch.nn.Module:
    if kind == "rms":
        return torch.nn.RMSNorm(dim, eps=eps, elementwise_affine=affine)
    return torch.nn.LayerNorm(dim, eps=eps, elementwise_affine=affine, bias=False)


@pytest.mark.parametrize("affine", [False, True])
@pytest.mark.parametrize("kind", KINDS)
def test_fp32_equals_torch(kind, affine):
    torch.manual_seed(0)
    ours, ref = make_norm(kind, 64, 1e-6, affine), _reference(kind, 64, 1e-6, affine)
    if affine:
        with torch.no_grad():
            ours.weight.uniform_(0.5, 1.5)
            ref.weight.copy_(ours.weight)
    x = torch.randn(3, 10, 64, requires_grad=True)
    xr = x.detach().clone().requires_grad_()
    dy = torch.randn(3, 10, 64)
    ours(x).backward(dy)
    ref(xr).backward(dy)
    torch.testing.assert_close(x.grad, xr.grad, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ours(x), ref(xr), rtol=1e-5, atol=1e-5)
    if affine:
        torch.testing.assert_close(ours.weight.grad, ref.weight.grad, rtol=1e-4, atol=1e-4)


def _saved_under_autocast(kind: str, device: str) -> tuple[torch.dtype, list[torch.Tensor]]:
    norm = make_norm(kind, 256, 1e-6).to(device)
    x = torch.randn(4, 32, 256, device=device, dtype=torch.bfloat16, requires_grad=True)
    saved: list[torch.Tensor] = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        with torch.autocast(device, dtype=torch.bfloat16):
            y = norm(x)
    return y.dtype, saved


def _check_saved(y_dtype: torch.dtype, saved: list[torch.Tensor]) -> None:
    assert y_dtype == torch.bfloat16
    whole = [t for t in saved if t.numel() == 4 * 32 * 256]
    assert whole and all(t.dtype == torch.bfloat16 for t in whole), [t.dtype for t in whole]
    stats = sum(t.numel() for t in saved if t.numel() != 4 * 32 * 256)
    assert stats <= 2 * 4 * 32, stats  # per row: mean and rstd at most


@pytest.mark.parametrize("kind", KINDS)
def test_bf16_autocast_keeps_bf16_and_saves_the_input_on_cpu(kind):
    _check_saved(*_saved_under_autocast(kind, "cpu"))


@pytest.mark.gpu
@pytest.mark.parametrize("kind", KINDS)
def test_bf16_autocast_keeps_bf16_and_saves_the_input_on_cuda(kind):
    _check_saved(*_saved_under_autocast(kind, "cuda"))
