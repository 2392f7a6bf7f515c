"""Deterministic EDM samplers (Euler / Heun) with classifier-free guidance.

Sampling side of Karras et al. 2022, "Elucidating the Design Space of Diffusion-Based Generative
Models" (EDM), https://arxiv.org/abs/2206.00364: the deterministic 2nd-order sampler of
Algorithm 1, which integrates the probability-flow ODE ``dx/dsigma = (x - D(x; sigma)) / sigma``
(eq. 4 with sigma(t) = t, s(t) = 1) from sigma_max to 0 over a schedule such as EDM's eq. 5
(:func:`vfm_core.diffusion.edm.karras_sigmas`).

Model-agnostic: the sampler only sees a denoiser callable ``denoise_fn(x, sigma, text) -> D`` with
x (B, ...) e.g. (B, C, T, H, W), sigma (B,), text (B, L, Dt); see
:meth:`vfm_core.diffusion.edm.EDM.denoise` for how a raw network becomes one.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

import torch
from torch import Tensor
from tqdm.auto import tqdm

from vfm_core.config import DiffusionConfig
from vfm_core.diffusion.edm import EDM, Net

Denoiser = Callable[[Tensor, Tensor, Any], Tensor]
"""``denoise_fn(x, sigma, text) -> D``: x (B, ...), sigma (B,), D like x."""

GuidedDenoiser = Callable[[Tensor, Tensor, Any, Any], Tensor]
"""``fn(x, sigma, text, null_text) -> D`` returned by :func:`guided`."""

METHODS = ("heun", "euler")

__all__ = [
    "METHODS",
    "Denoiser",
    "GuidedDenoiser",
    "guided",
    "sample",
    "sample_from_config",
]


def _cat(a: Any, b: Any) -> Any:
    """Concatenate two conditioning objects along the batch dim (tensors, dicts, tuples, lists)."""
    if isinstance(a, Tensor) and isinstance(b, Tensor):
        return torch.cat([a, b], dim=0)
    if isinstance(a, dict) and isinstance(b, dict) and a.keys() == b.keys():
        return {k: _cat(a[k], b[k]) for k in a}
    if isinstance(a, tuple | list) and type(a) is type(b) and len(a) == len(b):
        return type(a)(_cat(u, v) for u, v in zip(a, b, strict=True))
    raise TypeError(
        f"text/null_text: cannot batch {type(a).__name__} with {type(b).__name__} for guidance "
        "(expected tensors, or dicts/tuples/lists of tensors with the same structure)"
    )


def guided(denoise_fn: Denoiser, guidance: float) -> GuidedDenoiser:
    """Classifier-free guidance (Ho & Salimans 2022) around a denoiser ``d(x, sigma, text)``.

    Returns ``fn(x, sigma, text, null_text) -> uncond + g * (cond - uncond)`` that evaluates the
    conditional and unconditional branch in ONE batched call of ``d`` on ``[x, x]`` (2B, ...),
    ``[sigma, sigma]`` (2B,) and ``[text, null_text]`` (2B, L, Dt). With ``guidance == 1`` it calls
    ``d(x, sigma, text)`` once (batch B) and ``null_text`` may be None; with ``guidance == 0`` it
    calls ``d(x, sigma, null_text)`` once.
    """
    g = float(guidance)

    def fn(x: Tensor, sigma: Tensor, text: Any, null_text: Any = None) -> Tensor:
        if g == 1.0:
            return denoise_fn(x, sigma, text)  # (B, C, T, H, W)
        if null_text is None:
            raise ValueError(f"null_text: required when guidance != 1 (guidance={g})")
        if g == 0.0:
            return denoise_fn(x, sigma, null_text)
        b = x.shape[0]
        sigma = torch.as_tensor(sigma, dtype=x.dtype, device=x.device)
        if sigma.ndim == 0:
            sigma = sigma.expand(b)  # (B,)
        d = denoise_fn(
            torch.cat([x, x], dim=0),  # (2B, C, T, H, W)
            torch.cat([sigma, sigma], dim=0),  # (2B,)
            _cat(text, null_text),  # (2B, L, Dt)
        )
        cond, uncond = d[:b], d[b:]  # (B, C, T, H, W) each
        return uncond + g * (cond - uncond)

    return fn


def _check_sigmas(sigmas: Tensor) -> list[float]:
    if not isinstance(sigmas, Tensor) or sigmas.ndim != 1 or sigmas.numel() < 2:
        shape = tuple(sigmas.shape) if isinstance(sigmas, Tensor) else type(sigmas).__name__
        raise ValueError(
            f"sigmas: expected a 1-D tensor of at least 2 noise levels (num_steps >= 1), "
            f"got {shape}"
        )
    s = sigmas.detach().double().cpu().tolist()
    if s[-1] < 0 or any(a <= b for a, b in zip(s[:-1], s[1:], strict=True)):
        raise ValueError(f"sigmas: must be strictly decreasing and >= 0, got {s}")
    return s


@torch.no_grad()
def sample(
    denoise_fn: Denoiser,
    noise: Tensor,
    *,
    sigmas: Tensor,
    method: Literal["heun", "euler"] = "heun",
    text: Any,
    null_text: Any = None,
    guidance: float = 1.0,
    progress: bool = False,
) -> Tensor:
    """Deterministic EDM sampler (Algorithm 1 without stochastic churn, S_churn = 0).

    Integrates ``dx/dsigma = (x - D(x; sigma)) / sigma`` over ``sigmas`` (descending, e.g. from
    :func:`~vfm_core.diffusion.edm.karras_sigmas`)::

        x_0 = noise * sigmas[0]
        d_i = (x_i - D(x_i; s_i)) / s_i                               # Alg. 1 line 7
        x_{i+1} = x_i + (s_{i+1} - s_i) d_i                           # Alg. 1 line 8 (Euler)
        heun, s_{i+1} != 0:                                           # Alg. 1 lines 9-11
            d'_i = (x_{i+1} - D(x_{i+1}; s_{i+1})) / s_{i+1}          # at the NEXT point+sigma
            x_{i+1} = x_i + (s_{i+1} - s_i) (d_i + d'_i) / 2

    Args:
        denoise_fn: ``d(x, sigma, text) -> D`` with x (B, ...), sigma (B,).
        noise: (B, ...) standard normal noise, e.g. (B, C, T, H, W).
        sigmas: (N + 1,) strictly decreasing noise levels, usually ending in 0.
        method: "heun" (2nd order, 2N - 1 evaluations when sigmas end in 0) or "euler" (N).
        text: (B, L, Dt) conditioning, passed to ``denoise_fn``.
        null_text: (B, L, Dt) unconditional conditioning; required if ``guidance != 1``.
        guidance: classifier-free guidance scale (see :func:`guided`).
        progress: show a tqdm progress bar.

    Returns:
        (B, ...) sample at sigma = sigmas[-1], in float32 (float64 if ``noise`` is float64).
    """
    if method not in METHODS:
        raise ValueError(f"method: expected one of {METHODS}, got {method!r}")
    s = _check_sigmas(sigmas)
    dtype = torch.promote_types(noise.dtype, torch.float32)
    fn = guided(denoise_fn, guidance)
    b = noise.shape[0]

    def d_of(x: Tensor, sigma: float) -> Tensor:
        sig = torch.full((b,), sigma, dtype=dtype, device=x.device)  # (B,)
        return fn(x, sig, text, null_text).to(dtype)  # (B, C, T, H, W)

    x = noise.to(dtype) * s[0]  # (B, C, T, H, W)
    for i in tqdm(range(len(s) - 1), desc=f"sampling ({method})", disable=not progress):
        s_cur, s_next = s[i], s[i + 1]
        d_cur = (x - d_of(x, s_cur)) / s_cur  # (B, C, T, H, W)
        x_next = x + (s_next - s_cur) * d_cur
        if method == "heun" and s_next != 0:
            d_prime = (x_next - d_of(x_next, s_next)) / s_next
            x_next = x + (s_next - s_cur) * (0.5 * d_cur + 0.5 * d_prime)
        x = x_next
    return x


def sample_from_config(
    edm: EDM,
    net: Net,
    noise: Tensor,
    cfg: DiffusionConfig,
    *,
    text: Any,
    null_text: Any = None,
    progress: bool = False,
) -> Tensor:
    """Sample with the objective's schedule (EDM eq. 5, or rectified flow's shifted uniform t),
    ``cfg``'s method, step count and guidance.

    ``net`` is the raw network ``net(x_in, c_noise, text) -> F``, wrapped with ``edm.denoise``.
    ``noise``: (B, ...) standard normal, e.g. (B, C, T, H, W); returns a sample of that shape.
    """
    sigmas = edm.sampling_sigmas(cfg.num_steps).to(noise.device)

    def denoise_fn(x: Tensor, sigma: Tensor, t: Any) -> Tensor:
        return edm.denoise(net, x, sigma, t)

    return sample(
        denoise_fn,
        noise,
        sigmas=sigmas,
        method=cfg.sampler,
        text=text,
        null_text=null_text,
        guidance=cfg.guidance,
        progress=progress,
    )
