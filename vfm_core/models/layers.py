"""Building blocks shared by every DiT variant: patchify, timestep features, norms, 3D RoPE, MLPs
and
the one attention dispatch function.

Single-device code: nothing here knows about meshes; parallelism is applied from outside.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from vfm_core.geometry import Grid, rope_dims


def grid_positions(grid: Grid, device=None) -> torch.Tensor:
    """(t, h, w) index of every token of a raster-ordered grid: (N, 3) int64."""
    axes = [torch.arange(n, device=device) for n in grid]
    return torch.stack(torch.meshgrid(*axes, indexing="ij"), -1).reshape(-1, 3)  # (N, 3)


def with_positions(tokens: torch.Tensor, positions: torch.Tensor, width: int) -> torch.Tensor:
    """Patch tokens (B, N, F) -> (B, N, F + width): ``width`` fixed sin-cos features of each
    token's absolute (t, h, w) index appended (``width`` // 3 per axis, as in ViT / MAE's
    factorised embeddings), which the patch embedding's linear maps to a learned absolute
    position embedding; ``width`` = 0 returns ``tokens`` (relative RoPE only)."""
    if width == 0:
        return tokens
    per_axis = width // 3
    half = per_axis // 2
    freqs = 10000.0 ** (-torch.arange(half, dtype=torch.float32, device=tokens.device) / half)
    ang = positions.to(tokens.device).float()[:, :, None] * freqs  # (N, 3, half)
    feats = torch.cat([ang.sin(), ang.cos()], -1).reshape(len(positions), 3 * per_axis)  # (N, W)
    return torch.cat([tokens, feats.to(tokens.dtype).expand(tokens.shape[0], -1, -1)], -1)


# ----------------------------------------------------------------------------------------- timestep
def timestep_features(c_noise: torch.Tensor, dim: int, max_period: float = 10000.0) -> torch.Tensor:
    """Sinusoidal features of the (continuous) noise conditioning, (B,) -> (B, dim) (DiT eq. as in
    'Attention is all you need' positional encodings)."""
    half = dim // 2
    freqs = torch.exp(
        -math.log(max_period)
        * torch.arange(half, dtype=torch.float32, device=c_noise.device)
        / half
    )
    args = c_noise.float()[:, None] * freqs[None] * 1000.0  # (B, half); c_noise=ln(sigma)/4 is O(1)
    return torch.cat([torch.cos(args), torch.sin(args)], dim=-1)  # (B, dim)


class TimestepEmbedder(nn.Module):
    """c_noise (B,) -> embedding (B, D) through sinusoidal features and a 2-layer MLP."""

    def __init__(self, hidden: int, freq_dim: int = 256):
        super().__init__()
        self.freq_dim = freq_dim
        self.mlp = nn.Sequential(nn.Linear(freq_dim, hidden), nn.SiLU(), nn.Linear(hidden, hidden))

    def forward(self, c_noise: torch.Tensor) -> torch.Tensor:
        feats = timestep_features(c_noise, self.freq_dim)  # (B, F)
        return self.mlp(feats.to(self.mlp[0].weight.dtype))  # (B, D)


# ------------------------------------------------------------------------------------------- text
def padding_mask(context: torch.Tensor) -> torch.Tensor | None:
    """Real tokens of a zero-padded text condition (B, S, Dt): a row that is exactly zero is
    padding (real token embeddings never are). None when nothing is padded. An all-zero condition
    (the null caption of runs without a text record) keeps every token, as unmasked attention
    would. Cross-attention's key mask and :func:`pool_text`'s rows."""
    real = context.detach().abs().amax(-1) > 0  # (B, S)
    if has_values(real) and bool(real.all()):  # compiled / traced: the all-True mask is the same
        return None  # attention, without a host sync
    return real | ~real.any(-1, keepdim=True)  # (B, S)


def has_values(t: torch.Tensor) -> bool:
    """Whether ``t``'s values can be read on the host for a shortcut: not while compiling, nor
    for the fake tensors ``vfm plan --check`` traces a step with (shapes only)."""
    from torch._subclasses.fake_tensor import is_fake  # noqa: PLC2701

    return not torch.compiler.is_compiling() and not is_fake(t)


def pool_text(text: torch.Tensor, lengths: torch.Tensor | None = None) -> torch.Tensor:
    """Caption tokens (B, L, Dt) -> (B, Dt): the mean of each caption's real tokens, the first
    ``lengths`` (B,) (packs), else those :func:`padding_mask` keeps, so a caption alone and
    padded pool alike."""
    b, L, _ = text.shape
    if lengths is None:
        valid = padding_mask(text)  # (B, L) or None: nothing padded
        if valid is None:
            valid = torch.ones(b, L, dtype=torch.bool, device=text.device)
    else:
        valid = torch.arange(L, device=text.device)[None] < lengths.to(text.device)[:, None]
    total = (text * valid[..., None].to(text.dtype)).sum(1)  # (B, Dt)
    return total / valid.sum(1, keepdim=True).to(text.dtype)


class PooledTextEmbedder(nn.Module):
    """``model.text_conditioning='pooled'``: caption (B, L, Dt) -> (B, D), a linear map of its
    mean token (:func:`pool_text`); the DiT adds it to the timestep embedding, the causal
    model to every token's embedding (``tokens``: a count n -> (B, n, D), every token its
    sample's row; (n,) sample index per token of a pack -> (1, n, D)), as a sequence the
    parallel engine cuts like the embedding."""

    def __init__(self, text_dim: int, hidden: int):
        super().__init__()
        self.proj = nn.Linear(text_dim, hidden)

    def forward(
        self,
        text: torch.Tensor,  # (B, L, Dt)
        lengths: torch.Tensor | None = None,  # (B,) valid tokens
        *,
        tokens: int | torch.Tensor | None = None,
    ) -> torch.Tensor:
        emb = self.proj(pool_text(text, lengths).to(self.proj.weight.dtype))  # (B, D)
        if tokens is None:
            return emb
        if isinstance(tokens, int):
            return emb[:, None].expand(-1, tokens, -1)  # (B, n, D)
        return emb[tokens.to(emb.device)][None]  # (1, n, D)


# ----------------------------------------------------------------------------------------- norms
class RMSNorm(nn.RMSNorm):
    """``nn.RMSNorm`` that saves what the fused GPU kernel saves, on every device: its input (in
    the input's dtype) and the fp32 rstd (:class:`RMSNormFunction`; on CUDA ``F.rms_norm``, whose
    fused kernel saves exactly that). CPU's ``rms_norm`` is decomposed: for a bf16 input it keeps
    two fp32 copies (4x the input's bytes; the QK norms alone were 1.3x a dit-7b block's planned
    activations in ``vfm plan --check``), so a CPU trace would not measure the GPU's memory.
    Autocast is off inside (CPU autocast runs ``rms_norm`` in fp32): the output has the input's
    dtype. fp32 forwards equal ``nn.RMSNorm``'s. Same parameters, same checkpoints."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.weight
        if w is not None and w.dtype != x.dtype:
            w = w.to(x.dtype)
        with torch.autocast(x.device.type, enabled=False):
            if x.device.type == "cuda":
                return F.rms_norm(x, self.normalized_shape, w, self.eps)
            return RMSNormFunction.apply(x, w, self.normalized_shape, self.eps)


class RMSNormFunction(torch.autograd.Function):
    """y = x · rstd · w over the last ``len(shape)`` dims, rstd = 1/sqrt(mean(x²) + eps) in
    fp32; saves (x, rstd, w). Backward (u = dy · w): dx = rstd · (u - x · rstd² · mean(u · x)),
    dw = Σ dy · x · rstd over the leading dims.

    Written in few full-size passes and allocations (the backward allocates one temporary and
    dx): every broadcast of a per-row (..., 1) factor goes into a per-row coefficient first (an
    (..., 1) tensor) and the full-size work is ``addcmul`` and in-place multiplies. On CPU (one
    thread) a (8, 256, 8, 64) QK norm's forward + backward took 2.19 ms against 4.65 ms for the
    same formulas written term by term (and 4.51 ms for CPU's decomposed ``F.rms_norm``), the
    same values to fp32 rounding (tests/models/test_fused_kernels.py). dw is a sum, not a matmul, so
    FlopCounterMode still counts the model's matmuls exactly."""

    @staticmethod
    def forward(ctx, x, w, shape, eps):
        dims = tuple(range(-len(shape), 0))
        eps = torch.finfo(x.dtype).eps if eps is None else eps
        xf = x.float() if x.dtype != torch.float64 else x
        rstd = torch.rsqrt(xf.square().mean(dims, keepdim=True) + eps)  # (..., 1)
        y = torch.mul(xf, rstd)  # a fresh tensor: the multiply by w runs in place
        if w is not None:
            y.mul_(w)
        ctx.save_for_backward(x, rstd, w)
        ctx.dims = dims
        return y.to(x.dtype)

    @staticmethod
    def backward(ctx, dy):
        x, rstd, w = ctx.saved_tensors
        dims = ctx.dims
        xf = x.float() if x.dtype != torch.float64 else x
        dyf = dy.to(xf.dtype)
        t = (dyf * xf).mul_(rstd)  # dy · x̂, x̂ = x · rstd: the one full-size temporary
        dw = None
        if w is not None and ctx.needs_input_grad[1]:  # a sum, no matmul: FLOP counts exact
            dw = t.sum(tuple(range(dy.dim() - len(dims)))).to(w.dtype)
        if w is not None:
            t.mul_(w)  # u · x̂, u = dy · w
        coef = t.mean(dims, keepdim=True).mul_(rstd).neg_()  # -rstd² · mean(u · x), (..., 1)
        del t
        u = dyf * w if w is not None else dyf.clone()
        dx = u.addcmul_(xf, coef).mul_(rstd)  # rstd · (u - x · rstd² · mean(u · x))
        return dx.to(x.dtype), dw, None, None


class LayerNorm(nn.LayerNorm):
    """``nn.LayerNorm`` whose output has its input's dtype on every device: autocast is off
    inside. CUDA autocast runs ``layer_norm`` in fp32 (an fp32 copy of a bf16 input saved for
    backward, an fp32 output that the AdaLN modulation after it saves again), CPU autocast in
    the input's dtype: measured on an H200, dit-7b's step held 0.26 GiB more per block at 4k
    tokens than its CPU trace (52.7 vs 45.6 GiB at full depth, ``vfm plan --check --on-gpu``).
    The fused kernels accumulate the statistics in fp32 either way. fp32 forwards equal
    ``nn.LayerNorm``'s. Same parameters, same checkpoints."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w, b = self.weight, self.bias
        if w is not None and w.dtype != x.dtype:
            w = w.to(x.dtype)
        if b is not None and b.dtype != x.dtype:
            b = b.to(x.dtype)
        with torch.autocast(x.device.type, enabled=False):
            return F.layer_norm(x, self.normalized_shape, w, b, self.eps)


def make_norm(kind: str, dim: int, eps: float, affine: bool = False) -> nn.Module:
    """RMSNorm or LayerNorm. The DiT's pre-norms before AdaLN modulation: affine=False, since
    shift/scale come from the conditioning; the causal model's: a weight (LayerNorm without
    bias, as GPT-2 in nanoGPT, so both kinds have the same parameters)."""
    if kind == "rms":
        return RMSNorm(dim, eps=eps, elementwise_affine=affine)
    return LayerNorm(dim, eps=eps, elementwise_affine=affine, bias=False)


# ----------------------------------------------------------------------------------------- 3D RoPE
def rope_3d(grid: Grid, head_dim: int, theta: float, device=None) -> torch.Tensor:
    """Rotation angles of a factorised 3D RoPE for the raster-ordered grid: (N, head_dim // 2).

    Each of t, h, w rotates its own slice of the head dimension with frequencies
    theta^(-2i/d_axis), so attention scores depend on relative offsets along every axis.
    """
    angles = []
    for size, d, axis in zip(grid, rope_dims(head_dim), range(3)):
        if d == 0:
            continue
        freqs = theta ** (-torch.arange(0, d, 2, dtype=torch.float32, device=device) / d)  # (d/2,)
        pos = torch.arange(size, dtype=torch.float32, device=device)
        ang = pos[:, None] * freqs[None]  # (size, d/2)
        shape = [1, 1, 1, d // 2]
        shape[axis] = size
        angles.append(ang.reshape(shape).expand(*grid, d // 2))
    return torch.cat(angles, dim=-1).reshape(-1, head_dim // 2)  # (N, hd/2)


class _Rotate(torch.autograd.Function):
    """Tensors x (..., N, hd) real -> each rotated pairwise by ``rot`` (N, hd/2) complex, as one
    complex multiply per tensor in ``rot``'s precision; saves only ``rot``, once for all of them
    (the backward rotates the gradients back by its conjugate), so autograd keeps nothing of the
    size of q or k."""

    @staticmethod
    def forward(ctx, rot: torch.Tensor, *xs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        ctx.save_for_backward(rot)
        ctx.orders = [x.dim_order() for x in xs]  # the gradients go back in the inputs' layout
        return tuple(_rotate(x, rot) for x in xs)

    @staticmethod
    def backward(ctx, *grads: torch.Tensor):
        (rot,) = ctx.saved_tensors
        back = rot.conj()
        return None, *(
            None if g is None else _rotate(g, back, order)
            for g, order in zip(grads, ctx.orders, strict=True)
        )


def _rotate(x: torch.Tensor, rot: torch.Tensor, order: tuple[int, ...] | None = None):
    """x (..., N, hd) rotated by ``rot`` into a fresh tensor laid out contiguously (as attention
    wants q and k: a strided one would be copied there and kept), or with its dims in memory
    ``order`` (``Tensor.dim_order``: the backward writes a gradient in its input's layout, the
    (B, N, H, d) of the QK norm before the head transpose, so the norm's backward reads
    contiguous memory; its passes over a transposed gradient took 2x as long)."""
    xf = x.to(rot.real.dtype)
    if xf.stride(-1) != 1:
        xf = xf.contiguous()
    xc = torch.view_as_complex(xf.unflatten(-1, (-1, 2)))  # (..., N, hd/2) complex
    if order is None or list(order) == sorted(order):
        out = torch.empty(xc.shape, dtype=xc.dtype, device=xc.device)
    else:
        out = torch.empty([xc.shape[d] for d in order], dtype=xc.dtype, device=xc.device)
        out = out.permute([order.index(d) for d in range(len(order))])  # xc's shape, in order
    torch.mul(xc, rot, out=out)
    return torch.view_as_real(out).flatten(-2).to(x.dtype)  # (..., N, hd)


def apply_rope(x: torch.Tensor, angles: torch.Tensor) -> torch.Tensor:
    """Rotate pairs (x[2i], x[2i+1]) of (B, heads, N, hd) by angles (N, hd/2): one complex
    multiply in float32 (float64 stays float64), forward and backward (:class:`_Rotate`), about
    5x faster than the same rotation written as real products; it saves only the (N, hd/2)
    rotation, as the real form saved cos and sin."""
    return apply_rope_qk(x, None, angles)[0]


def apply_rope_qk(
    q: torch.Tensor, k: torch.Tensor | None, angles: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """:func:`apply_rope` of queries q (B, Hq, N, hd) and keys k (B, Hkv, N, hd) (or None) by
    the same angles (N, hd/2) in one autograd node: the rotation (cos, sin as one complex
    tensor) is built once for both and saved once."""
    dtype = torch.promote_types(q.dtype, torch.float32)
    xs = (q,) if k is None else (q, k)
    if torch.compiler.is_compiling():  # inductor has no complex kernels: real products, fused
        cos_sin = angles.to(dtype)
        out = tuple(rotate_real(x, cos_sin) for x in xs)
    else:
        rot = torch.polar(torch.ones((), dtype=dtype, device=angles.device), angles.to(dtype))
        out = _Rotate.apply(rot, *xs)
    return out[0], (out[1] if k is not None else None)


def rotate_real(x: torch.Tensor, angles: torch.Tensor) -> torch.Tensor:
    """The same rotation as :func:`_rotate` in real arithmetic (for compiled regions)."""
    cos, sin = angles.cos(), angles.sin()  # (N, hd/2)
    xf = x.to(angles.dtype).unflatten(-1, (-1, 2))  # (..., N, hd/2, 2)
    a, b = xf[..., 0], xf[..., 1]
    return torch.stack((a * cos - b * sin, a * sin + b * cos), -1).flatten(-2).to(x.dtype)


# ----------------------------------------------------------------------------------------- MLPs
class GeluMLP(nn.Module):
    """fc1 -> GELU (``approximate``: "tanh", DiT's, or "none", the exact erf) -> fc2, with or
    without biases."""

    def __init__(self, dim: int, ratio: float, approximate: str = "tanh", bias: bool = True):
        super().__init__()
        inner = int(dim * ratio)
        self.approximate = approximate
        self.fc1 = nn.Linear(dim, inner, bias=bias)
        self.fc2 = nn.Linear(inner, dim, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x), approximate=self.approximate))  # (B, N, D)


def swiglu_width(dim: int, ratio: float, multiple_of: int = 64) -> int:
    """Llama rule: 2/3 of the GELU MLP width, rounded up to a multiple (same FLOPs as GELU MLP)."""
    inner = int(2 * dim * ratio / 3)
    return multiple_of * ((inner + multiple_of - 1) // multiple_of)


class SwiGLU(nn.Module):
    def __init__(self, dim: int, ratio: float):
        super().__init__()
        inner = swiglu_width(dim, ratio)
        self.w1 = nn.Linear(dim, inner, bias=False)  # gate
        self.w3 = nn.Linear(dim, inner, bias=False)  # up
        self.w2 = nn.Linear(inner, dim, bias=False)  # down

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))  # (B, N, D)


def make_mlp(kind: str, dim: int, ratio: float, bias: bool = True) -> nn.Module:
    """``model.mlp``: swiglu, gelu (tanh approximation) or gelu_exact; ``bias``: the GELU MLP's
    (``model.mlp_bias``)."""
    if kind == "swiglu":
        return SwiGLU(dim, ratio)
    return GeluMLP(dim, ratio, approximate="none" if kind == "gelu_exact" else "tanh", bias=bias)


# -----------------------------------------------------------------------------------------
# attention
ATTENTION_BACKENDS = ("sdpa", "math", "te")
"""Attention kernels: 'sdpa' (torch fused / flash on GPU), 'math' (reference, counted by
FlopCounterMode), 'te' (transformer-engine, see te_adapter). An attention core holds its own
(:func:`vfm_core.models.local_attention.set_attention_backend`); nothing here is global."""


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None = None,
    *,
    causal: bool = False,
    backend: str = "sdpa",
) -> torch.Tensor:
    """The one attention dispatch, through the kernel ``backend`` (:data:`ATTENTION_BACKENDS`).
    q (B, Hq, Sq, d); k, v (B, Hkv, Sk, d) with Hq % Hkv == 0 (GQA); mask: boolean
    (B|1, 1, Sq|1, Sk), True = attend; ``causal`` (Sq == Sk, no mask): query i attends to keys
    <= i, SDPA's ``is_causal`` (no mask tensor is built or saved, and on a GPU the flash kernel
    serves it; on CPU bit-identical to the explicit lower-triangular mask, measured). Returns
    (B, Hq, Sq, d)."""
    hq, hkv = q.shape[1], k.shape[1]
    if causal and (mask is not None or q.shape[2] != k.shape[2]):
        raise ValueError(
            f"causal attention takes no mask and as many keys as queries, got {q.shape[2]} "
            f"queries and {k.shape[2]} keys (mask {'given' if mask is not None else 'none'})"
        )
    if backend == "math":
        if hq != hkv:
            k = k.repeat_interleave(hq // hkv, dim=1)  # (B, Hq, Sk, d)
            v = v.repeat_interleave(hq // hkv, dim=1)
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])  # (B, Hq, Sq, Sk)
        if causal:
            mask = torch.ones(q.shape[2], k.shape[2], dtype=torch.bool, device=q.device).tril()
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        return scores.softmax(dim=-1) @ v  # (B, Hq, Sq, d)
    if backend == "te" and mask is None and not causal:
        from vfm_core.models.te_adapter import te_attention

        return te_attention(q, k, v)
    return F.scaled_dot_product_attention(
        q, k, v, attn_mask=mask, is_causal=causal, enable_gqa=hq != hkv
    )
