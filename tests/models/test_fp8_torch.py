"""Torch-native FP8 backend: ``Float8Linear`` numerics against ``nn.Linear`` on CPU
(``torch._scaled_mm`` runs there), the conversion of a DiT, the backend selection; a GPU step.

Bounds are 2-3x the errors measured on CPU (torch 2.13, seed 0): e4m3 forward 0.037 relative,
e5m2 input / weight gradients 0.059, bias gradient 0 (fp32) / 0.0016 (bf16 reference); the
perturbed dit-tiny under bf16 autocast 0.010 on the output and 0.010 on all gradients together.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from fp8_gpu import require_fp8_backend
from torch import nn

from vfm_core.families import build_model
from vfm_core.models import fp8 as fp8_mod
from vfm_core.models.fp8 import (
    fp8_autocast,
    fp8_backend,
    fp8_linear_names,
    fp8_status,
    to_fp8_linears,
)
from vfm_core.models.fp8_torch import Float8Linear, to_torch_fp8_linears
from vfm_core.models.init import init_parameters
from vfm_core.recipes import get_recipe


def rel(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got.float() - want.float()).norm() / want.float().norm().clamp_min(1e-12)).item()


def autocast_or_not(dtype: torch.dtype | None, device: str = "cpu"):
    return torch.autocast(device, dtype=dtype or torch.bfloat16, enabled=dtype is not None)


def linear_pair(k: int, n: int, bias: bool = True) -> tuple[nn.Linear, Float8Linear]:
    torch.manual_seed(0)
    ref = nn.Linear(k, n, bias=bias)
    with torch.no_grad():
        if bias:
            ref.bias.normal_()
    f8 = Float8Linear(k, n, bias=bias)
    f8.load_state_dict(ref.state_dict())  # a plain linear's checkpoint loads as is
    return ref, f8


@pytest.mark.parametrize("cast", [None, torch.bfloat16], ids=["fp32", "bf16-autocast"])
def test_float8_linear_tracks_linear_forward_and_backward(cast):
    ref, f8 = linear_pair(256, 512)
    x = torch.randn(4, 32, 256)  # (B, S, K): M = 128
    xr, xf = x.clone().requires_grad_(), x.clone().requires_grad_()
    with autocast_or_not(cast):
        want, got = ref(xr), f8(xf)  # (B, S, N)
    assert got.shape == want.shape and got.dtype == want.dtype == (cast or torch.float32)
    assert rel(got, want) < 0.08
    assert rel(got, want) > 0  # FP8 ran, not a fallback
    grad = torch.randn_like(want)
    want.backward(grad)
    got.backward(grad)
    for g, w, bound in [
        (xf.grad, xr.grad, 0.15),
        (f8.weight.grad, ref.weight.grad, 0.15),
        (f8.bias.grad, ref.bias.grad, 0.01),
    ]:
        assert g.dtype == w.dtype and g.shape == w.shape
        assert rel(g, w) < bound, (rel(g, w), bound)


@pytest.mark.parametrize(("k", "m"), [(24, 32), (32, 5)], ids=["in-features-24", "tokens-5"])
def test_misaligned_shapes_fall_back_to_f_linear_exactly(k, m):
    ref, f8 = linear_pair(k, 32)
    x = torch.randn(m, k)
    xr, xf = x.clone().requires_grad_(), x.clone().requires_grad_()
    want, got = F.linear(xr, ref.weight, ref.bias), f8(xf)
    assert torch.equal(got, want)
    want.sum().backward()
    got.sum().backward()
    assert torch.equal(xf.grad, xr.grad) and torch.equal(f8.weight.grad, ref.weight.grad)


def perturbed_dit(seed: int = 0, device: str = "cpu") -> nn.Module:
    """dit-tiny with every parameter nudged: its AdaLN-zero init gives an all-zero output."""
    model = build_model(get_recipe("dit-tiny").model, device=device)
    gen = torch.Generator(device=device).manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=gen, device=device) * 0.02)
    return model


def dit_inputs(device: str = "cpu") -> tuple[torch.Tensor, ...]:
    cfg = get_recipe("dit-tiny").model
    torch.manual_seed(1)
    x = torch.randn(2, cfg.in_channels, 4, 16, 16, device=device)  # (B, C, T, H, W): M = 512
    c = torch.rand(2, device=device)  # (B,)
    text = torch.randn(2, cfg.text_len, cfg.text_dim, device=device)  # (B, L, Dt)
    target = torch.randn_like(x)  # (B, C, T, H, W)
    return x, c, text, target


def step_pair(ref: nn.Module, model: nn.Module, device: str) -> tuple[float, float]:
    """Forward + backward of both under bf16 autocast -> (output rel error, all-gradient one)."""
    x, c, text, target = dit_inputs(device)
    with torch.autocast(device, dtype=torch.bfloat16), fp8_autocast(device == "cuda"):
        want, got = ref(x, c, text), model(x, c, text)
    assert got.dtype == want.dtype == torch.bfloat16
    F.mse_loss(want.float(), target).backward()
    F.mse_loss(got.float(), target).backward()
    grads = [p.grad for p in model.parameters()]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)
    flat = torch.cat([g.flatten() for g in grads])
    flat_ref = torch.cat([p.grad.flatten() for p in ref.parameters()])
    return rel(got, want), rel(flat, flat_ref)


def test_dit_conversion_keeps_parameters_and_tracks_bf16():
    ref = perturbed_dit()
    model = perturbed_dit()
    before = dict(model.named_parameters())
    names = fp8_linear_names(model)
    assert to_torch_fp8_linears(model, names) == len(names) == 40
    mods = dict(model.named_modules())
    assert all(type(mods[n]) is Float8Linear for n in names)
    after = dict(model.named_parameters())
    assert list(after) == list(before) and all(after[k] is before[k] for k in before)
    assert list(model.state_dict()) == list(ref.state_dict())
    model.load_state_dict(ref.state_dict())  # checkpoints interchangeable both ways
    ref.load_state_dict(model.state_dict())
    out_err, grad_err = step_pair(ref, model, "cpu")
    assert 0 < out_err < 0.03, out_err
    assert grad_err < 0.03, grad_err


def test_meta_conversion_touches_no_data_and_initialises_like_the_plain_model():
    """``Float8Linear.from_linear`` of a meta linear holds the same meta Parameters (nothing
    allocated or copied); a DiT converted on meta, then ``to_empty`` + ``init_parameters``,
    equals the plain model of the same seed, parameter for parameter."""
    old = nn.Linear(64, 32, device="meta")
    new = Float8Linear.from_linear(old)
    assert new.weight is old.weight and new.bias is old.bias and new.weight.is_meta
    cfg = get_recipe("dit-tiny").model
    model = build_model(cfg, device="meta")
    before = dict(model.named_parameters())
    assert to_fp8_linears(model, backend="torch") == 40
    after = dict(model.named_parameters())
    assert list(after) == list(before) and all(after[k] is before[k] for k in before)
    assert all(p.is_meta for p in after.values())
    model.to_empty(device="cpu")
    init_parameters(model, model.init_rule, seed=7)
    ref = build_model(cfg, seed=7).state_dict()
    assert list(model.state_dict()) == list(ref)
    assert all(torch.equal(v, ref[k]) for k, v in model.state_dict().items())
    with pytest.raises(fp8_mod.ConfigError, match="unknown FP8 backend 'e4m3'"):
        to_fp8_linears(model, backend="e4m3")


def test_backend_selection_without_transformer_engine(monkeypatch):
    """The choice on a pretend GPU: Hopper without TE -> torch; Ampere -> none."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (9, 0))
    monkeypatch.setattr(
        fp8_mod, "te_status", lambda: (False, "transformer-engine not installed (pip ...)")
    )
    assert fp8_status() == (
        True,
        "torch-native FP8 (torch._scaled_mm, tensorwise dynamic scaling; "
        "transformer-engine not installed)",
    )
    assert fp8_backend() == "torch"
    assert fp8_mod.resolve_fp8("on")[0] is True
    model = build_model(get_recipe("dit-tiny").model)
    assert to_fp8_linears(model) == len(fp8_linear_names(model))
    assert sum(isinstance(m, Float8Linear) for m in model.modules()) == 40
    with fp8_autocast(True):  # the torch backend needs no context
        pass
    with pytest.raises(fp8_mod.ConfigError, match="to transformer-engine: transformer-engine not"):
        fp8_mod.to_te_linears(model)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (8, 0))
    assert fp8_backend() is None
    assert fp8_status() == (
        False,
        "GPU compute capability 8.0 < 8.9 (FP8 needs Ada or Hopper)",
    )


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU refusal")
def test_conversion_is_refused_without_cuda():
    assert fp8_backend() is None
    with pytest.raises(fp8_mod.ConfigError, match="train.fp8: cannot convert linears to FP8"):
        to_fp8_linears(build_model(get_recipe("dit-tiny").model))


@pytest.mark.gpu
def test_torch_fp8_training_step_tracks_bf16_on_gpu():
    reason = require_fp8_backend("torch")
    assert reason.startswith("torch-native FP8 (torch._scaled_mm")
    ref = perturbed_dit(device="cuda")
    model = perturbed_dit(device="cuda")
    assert to_fp8_linears(model) == 40
    out_err, grad_err = step_pair(ref, model, "cuda")
    assert 0 < out_err < 0.03, out_err
    assert grad_err < 0.03, grad_err
