"""Torch-native FP8 linears: tensorwise dynamic scaling through ``torch._scaled_mm`` (the recipe
of torchao's ``Float8Linear``), the FP8 backend where transformer-engine is not installed.

Every call scales each GEMM operand by its own current amax (no history, no state): forward
``x @ W^T`` in e4m3 x e4m3; backward ``dY @ W`` and ``dY^T @ x`` with the gradient in e5m2
(range over precision) and the e4m3 casts of ``x`` and ``W`` saved by the forward (one byte per
element instead of the high-precision input). ``torch._scaled_mm`` accumulates in fp32 and writes
the compute dtype (the autocast dtype, else the input's); gradients come back in the dtypes of
the input and the parameters (the fp32 master weights under autocast).

FP8 GEMMs need every dimension a multiple of 16; a call where the tokens ``M``, the input
features ``K`` or the output features ``N`` is not runs plain ``F.linear`` (exactly the
``nn.Linear`` result). :class:`Float8Linear` is an ``nn.Linear`` with the same parameters and
names, so checkpoints stay interchangeable, FSDP2 shards it like a plain linear (its forward sees
the gathered weight), and a model converted on the ``meta`` device is materialised and initialised
exactly as the plain one.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from vfm_core.models.linear_swap import swap_linears

E4M3 = torch.float8_e4m3fn
"""Forward operands (inputs, weights): more mantissa."""
E5M2 = torch.float8_e5m2
"""Gradients: more exponent range."""
AMAX_EPS = 1e-12
"""Floor of the amax, so an all-zero tensor gets a finite scale."""
FP8_ALIGN = 16
"""FP8 GEMMs need M, K and N multiples of this."""
_COMPUTE_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def to_fp8(t: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """``t`` cast to the FP8 ``dtype`` with a per-tensor dynamic scale ``FP8_MAX / amax`` (fp32);
    returns ``(t * scale in FP8, 1 / scale)``: the inverse scale is what ``_scaled_mm`` takes."""
    fp8_max = torch.finfo(dtype).max
    amax = t.detach().abs().max().float().clamp_min(AMAX_EPS)  # () fp32
    scale = fp8_max / amax  # () fp32
    t8 = (t.float() * scale).clamp(-fp8_max, fp8_max).to(dtype)  # same shape as t
    return t8, scale.reciprocal()


def col_major(t: torch.Tensor) -> torch.Tensor:
    """(R, C) with the same values, laid out column-major (``_scaled_mm``'s second operand)."""
    return t.t().contiguous().t()  # (R, C), strides (1, R)


def fp8_aligned(m: int, k: int, n: int) -> bool:
    """Whether an (M, K) x (K, N) GEMM and its two backward GEMMs can run in FP8."""
    return m > 0 and m % FP8_ALIGN == 0 and k % FP8_ALIGN == 0 and n % FP8_ALIGN == 0


def compute_dtype(x: torch.Tensor) -> torch.dtype:
    """The dtype a linear on ``x`` computes in: autocast's where it is on for ``x``'s device,
    else ``x``'s own."""
    device_type = x.device.type
    if torch.is_autocast_enabled(device_type):
        return torch.get_autocast_dtype(device_type)
    return x.dtype


class _Float8LinearFn(torch.autograd.Function):
    """``y = x @ W^T + b`` with the three GEMMs in FP8 (module docstring)."""

    @staticmethod
    def forward(
        ctx,
        x: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        dtype: torch.dtype,
    ) -> torch.Tensor:
        lead = x.shape[:-1]
        x2 = x.reshape(-1, x.shape[-1])  # (M, K)
        x8, x_inv = to_fp8(x2, E4M3)  # (M, K) e4m3, () fp32
        w8, w_inv = to_fp8(weight, E4M3)  # (N, K) e4m3, () fp32
        out = torch._scaled_mm(
            x8, w8.t(), scale_a=x_inv, scale_b=w_inv, out_dtype=dtype
        )  # (M, N): (M, K) row-major @ (K, N) column-major
        if bias is not None:
            out = out + bias.to(dtype)  # (M, N)
        ctx.save_for_backward(x8, x_inv, w8, w_inv)
        ctx.dtypes = (x.dtype, weight.dtype, None if bias is None else bias.dtype)
        ctx.x_shape = x.shape
        return out.view(*lead, out.shape[-1])  # (..., N)

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):
        x8, x_inv, w8, w_inv = ctx.saved_tensors  # (M, K), (), (N, K), ()
        x_dtype, w_dtype, b_dtype = ctx.dtypes
        g2 = grad_out.reshape(-1, grad_out.shape[-1])  # (M, N)
        g8, g_inv = to_fp8(g2, E5M2)  # (M, N) e5m2, () fp32
        grad_x = grad_w = grad_b = None
        if ctx.needs_input_grad[0]:
            grad_x = torch._scaled_mm(
                g8, col_major(w8), scale_a=g_inv, scale_b=w_inv, out_dtype=x_dtype
            )  # (M, K) = (M, N) @ (N, K)
            grad_x = grad_x.view(ctx.x_shape)  # (..., K)
        if ctx.needs_input_grad[1]:
            grad_w = torch._scaled_mm(
                g8.t().contiguous(), col_major(x8), scale_a=g_inv, scale_b=x_inv, out_dtype=w_dtype
            )  # (N, K) = (N, M) @ (M, K)
        if ctx.needs_input_grad[2]:
            grad_b = g2.float().sum(0).to(b_dtype)  # (N,)
        return grad_x, grad_w, grad_b, None


class Float8Linear(nn.Linear):
    """``nn.Linear`` whose GEMMs run in FP8 with tensorwise dynamic scaling (module docstring);
    same parameters and names, so ``load_state_dict`` takes a plain linear's state. Shapes FP8
    cannot take (a dimension not a multiple of 16) and dtypes other than fp32 / bf16 / fp16 run
    ``F.linear``."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(..., K) -> (..., N)."""
        dtype = compute_dtype(x)
        m = x.numel() // max(self.in_features, 1)
        if dtype not in _COMPUTE_DTYPES or not fp8_aligned(m, self.in_features, self.out_features):
            return F.linear(x, self.weight, self.bias)  # (..., N)
        return _Float8LinearFn.apply(x, self.weight, self.bias, dtype)  # (..., N)

    @classmethod
    def from_linear(cls, old: nn.Linear) -> Float8Linear:
        """The FP8 twin of ``old`` holding its very Parameter objects (device, dtype, values and
        names unchanged). Built on ``meta`` and given ``old``'s parameters, it allocates and
        copies nothing, so a meta ``old`` (a layout before ``to_empty``) converts for free."""
        new = cls(
            old.in_features,
            old.out_features,
            bias=old.bias is not None,
            device="meta",
            dtype=old.weight.dtype,
        )
        new.weight, new.bias = old.weight, old.bias
        return new.train(old.training)


def to_torch_fp8_linears(model: nn.Module, names: list[str]) -> int:
    """Replace the ``nn.Linear`` submodules ``names`` of ``model`` by :class:`Float8Linear`
    holding the same Parameter objects; returns how many were replaced."""
    return swap_linears(model, names, Float8Linear.from_linear)
