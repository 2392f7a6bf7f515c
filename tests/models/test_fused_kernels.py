"""The fewer-pass element-wise kernels of the recipe architectures compute what the term-by-term
formulations they replaced computed: same outputs and gradients (to fp32 rounding; exactly in
fp64), same saved tensors.

* :class:`~vfm_core.models.layers.RMSNormFunction`: against plain autograd of
  x · rsqrt(mean(x²) + eps) · w (the formula its previous forward and backward spelled out).
* :func:`~vfm_core.models.layers.apply_rope_qk` (q and k rotated in one node, the rotation built
  and saved once): against :func:`apply_rope` of each, and against the real-arithmetic rotation.
* :func:`~vfm_core.models.adaln.modulate` and :func:`~vfm_core.models.adaln.gated_residual` (one
  ``addcmul``): against x · (1 + scale) + shift and x + gate · branch.
"""

from __future__ import annotations

import pytest
import torch

from vfm_core.models.adaln import gated_residual, modulate
from vfm_core.models.layers import (
    RMSNorm,
    RMSNormFunction,
    apply_rope,
    apply_rope_qk,
    rope_3d,
    rotate_real,
)


def reference_rms_norm(x: torch.Tensor, w: torch.Tensor | None, eps: float) -> torch.Tensor:
    """The previous formulation: fp32 statistics, autograd through every term."""
    xf = x.float() if x.dtype != torch.float64 else x
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    if w is not None:
        y = y * w
    return y.to(x.dtype)


def _pair(shape, dtype, affine, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(*shape, generator=g, dtype=torch.float64) * 3).to(dtype)
    w = (torch.randn(shape[-1], generator=g, dtype=torch.float64) + 1).to(dtype)
    dy = torch.randn(*shape, generator=g, dtype=torch.float64).to(dtype)
    return x, (w if affine else None), dy


def _run(fn, x, w, dy):
    x = x.clone().requires_grad_()
    w = None if w is None else w.clone().requires_grad_()
    y = fn(x, w)
    y.backward(dy)
    return y.detach(), x.grad, None if w is None else w.grad


@pytest.mark.parametrize("shape", [(2, 16, 4, 64), (2, 16, 96)])  # QK norm, block norm
@pytest.mark.parametrize("affine", [True, False])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_rms_norm_function_matches_the_term_by_term_formula(shape, affine, dtype):
    x, w, dy = _pair(shape, dtype, affine)
    got = _run(lambda a, b: RMSNormFunction.apply(a, b, (shape[-1],), 1e-6), x, w, dy)
    want = _run(lambda a, b: reference_rms_norm(a, b, 1e-6), x, w, dy)
    tol = dict(rtol=1e-12, atol=1e-12) if dtype == torch.float64 else dict(rtol=1e-5, atol=1e-5)
    for a, b in zip(got, want):
        if b is None:
            assert a is None
            continue
        torch.testing.assert_close(a, b, **tol)
    if dtype == torch.float32:  # the forward is the same sequence of fp32 ops
        torch.testing.assert_close(got[0], want[0], rtol=0, atol=0)


def test_rms_norm_bf16_matches_the_fp32_formula_and_saves_input_and_fp32_rstd():
    x, w, dy = _pair((2, 8, 4, 32), torch.bfloat16, True)
    got = _run(lambda a, b: RMSNormFunction.apply(a, b, (32,), 1e-6), x, w, dy)
    want = _run(lambda a, b: reference_rms_norm(a, b, 1e-6), x, w, dy)
    for a, b in zip(got, want):
        assert a.dtype == b.dtype == torch.bfloat16
        torch.testing.assert_close(a, b, rtol=2e-2, atol=2e-2)
    saved = []
    xr = x.clone().requires_grad_()
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        RMSNorm(32, eps=1e-6).to(torch.bfloat16)(xr)
    # the input in its dtype, the fp32 rstd (one per row) and the weight: nothing full-size in fp32
    assert sorted((tuple(t.shape), t.dtype) for t in saved) == sorted(
        [((2, 8, 4, 32), torch.bfloat16), ((2, 8, 4, 1), torch.float32), ((32,), torch.bfloat16)]
    )


def _rope_inputs(dtype):
    g = torch.Generator().manual_seed(1)
    angles = rope_3d((2, 3, 4), 16, 10000.0)  # (24, 8)
    q = torch.randn(2, 24, 4, 16, generator=g, dtype=dtype).transpose(1, 2)  # (B, Hq, N, d)
    k = torch.randn(2, 24, 2, 16, generator=g, dtype=dtype).transpose(1, 2)  # (B, Hkv, N, d)
    dq, dk = torch.randn_like(q), torch.randn_like(k)
    return angles, q, k, dq, dk


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_rope_of_q_and_k_in_one_node_matches_each_rotated_alone_and_the_real_form(dtype):
    angles, q, k, dq, dk = _rope_inputs(dtype)

    def run(rotate):
        qq, kk = q.clone().requires_grad_(), k.clone().requires_grad_()
        rq, rk = rotate(qq, kk)
        (rq * dq).sum().add((rk * dk).sum()).backward()
        return rq.detach(), rk.detach(), qq.grad, kk.grad

    fused = run(lambda a, b: apply_rope_qk(a, b, angles))
    alone = run(lambda a, b: (apply_rope(a, angles), apply_rope(b, angles)))
    real = run(lambda a, b: (rotate_real(a, angles.to(dtype)), rotate_real(b, angles.to(dtype))))
    for f, a, r in zip(fused, alone, real):
        torch.testing.assert_close(f, a, rtol=0, atol=0)  # the same complex multiplies
        torch.testing.assert_close(f, r)
    assert fused[0].is_contiguous() and fused[1].is_contiguous()  # as attention wants them


def test_rope_of_q_and_k_saves_one_rotation():
    angles, q, k, _, _ = _rope_inputs(torch.float32)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        apply_rope_qk(q.clone().requires_grad_(), k.clone().requires_grad_(), angles)
    assert [(tuple(t.shape), t.dtype) for t in saved] == [((24, 8), torch.complex64)]


@pytest.mark.parametrize("per_token", [False, True])  # (B, D) per sample; (B, N, D) packs
def test_modulate_and_gated_residual_match_the_two_pass_forms(per_token):
    g = torch.Generator().manual_seed(2)
    cond = (2, 5, 8) if per_token else (2, 8)
    x, branch = (torch.randn(2, 5, 8, generator=g, dtype=torch.float64) for _ in range(2))
    shift, scale, gate = (torch.randn(*cond, generator=g, dtype=torch.float64) for _ in range(3))
    dy = torch.randn(2, 5, 8, generator=g, dtype=torch.float64)

    def run(fn):
        ins = [t.clone().requires_grad_() for t in (x, branch, shift, scale, gate)]
        fn(*ins).backward(dy)
        return [t.grad for t in ins]

    def expand(t):
        return t if per_token else t[:, None]

    def new(x, br, sh, sc, ga):
        return gated_residual(modulate(x, sh, sc), ga, br)

    def old(x, br, sh, sc, ga):
        return (x * (1 + expand(sc)) + expand(sh)) + expand(ga) * br

    with torch.no_grad():
        torch.testing.assert_close(
            new(x, branch, shift, scale, gate), old(x, branch, shift, scale, gate)
        )
    for a, b in zip(run(new), run(old)):
        torch.testing.assert_close(a, b)


def test_rope_gradients_come_back_in_the_inputs_layout():
    """q and k enter as (B, N, H, d) memory seen as (B, H, N, d) (the QK norm's output, heads
    transposed): their gradients are laid out alike, so the norm's backward reads contiguous
    memory; the rotated outputs stay contiguous for attention."""
    angles, q, k, dq, dk = _rope_inputs(torch.float32)
    qq, kk = q.clone().requires_grad_(), k.clone().requires_grad_()
    rq, rk = apply_rope_qk(qq, kk, angles)
    (rq * dq).sum().add((rk * dk).sum()).backward()
    for inp, grad in ((q, qq.grad), (k, kk.grad)):
        assert grad.dim_order() == inp.dim_order() == (0, 2, 1, 3)
    assert rq.is_contiguous() and rk.is_contiguous()
