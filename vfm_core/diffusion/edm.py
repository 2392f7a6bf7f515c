"""EDM preconditioning, training loss, noise-level distribution and sampling schedule (eq. 5).

Implements the training side of Karras et al. 2022, "Elucidating the Design Space of
Diffusion-Based Generative Models" (EDM), https://arxiv.org/abs/2206.00364.

The diffusion math is model-agnostic (in the spirit of facebookresearch/DiT's ``create_diffusion``):
it never imports :mod:`vfm_core.models` and takes the raw network as a callable::

    net(x_in, c_noise, text) -> F
        x_in:    (B, ...)  preconditioned noisy latent, e.g. (B, C, T, H, W)
        c_noise: (B,)      noise conditioning ln(sigma) / 4
        text:    (B, L, Dt) caption embeddings (or any object, passed through untouched)
        F:       (B, ...)  raw network output, same shape as x_in

and wraps it into the denoiser ``D(x; sigma) = c_skip * x + c_out * F(c_in * x; c_noise)``
(EDM eq. 7, coefficients from Table 1).

Latent scaling: EDM assumes the data has standard deviation ``sigma_data``. Tokenizer latents are
therefore first normalised to ~zero mean and unit std with dataset statistics and then multiplied by
``sigma_data`` (:func:`scale_latents`); samples are mapped back with :func:`unscale_latents` before
decoding.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from vfm_core.config import DiffusionConfig

Net = Callable[[Tensor, Tensor, Any], Tensor]
"""Raw network ``net(x_in, c_noise, text) -> F`` (see the module docstring)."""

__all__ = [
    "EDM",
    "Net",
    "compute_dtype",
    "karras_sigmas",
    "scale_latents",
    "unscale_latents",
]


def scale_latents(
    z: Tensor, mean: float | Tensor, std: float | Tensor, *, sigma_data: float = 0.5
) -> Tensor:
    """Map tokenizer latents to the EDM data scale: ``(z - mean) / std * sigma_data``.

    ``mean`` and ``std`` are dataset statistics of the latents (scalars, or tensors broadcastable
    against ``z``, e.g. per-channel ``(1, C, 1, 1, 1)`` for ``z`` of shape ``(B, C, T, H, W)``).
    The result has ~unit std times ``sigma_data``, as EDM's preconditioning (Table 1) assumes.
    """
    return (z - mean) / std * sigma_data


def unscale_latents(
    x: Tensor, mean: float | Tensor, std: float | Tensor, *, sigma_data: float = 0.5
) -> Tensor:
    """Inverse of :func:`scale_latents`: ``x / sigma_data * std + mean``."""
    return x / sigma_data * std + mean


def karras_sigmas(
    num_steps: int,
    *,
    sigma_min: float,
    sigma_max: float,
    rho: float,
    device: torch.device | str | None = None,
    dtype: torch.dtype = torch.float32,
) -> Tensor:
    """Noise levels of EDM eq. 5, descending, with t_N = 0 appended; shape (num_steps + 1,).

    ``t_i = (sigma_max^(1/rho) + i / (N - 1) * (sigma_min^(1/rho) - sigma_max^(1/rho)))^rho``
    for i = 0 .. N-1 (N = ``num_steps``), so t_0 = sigma_max and t_{N-1} = sigma_min; then
    t_N = 0. With ``num_steps == 1`` the schedule is ``[sigma_max, 0]``. Computed in float64 and
    cast to ``dtype``.
    """
    if isinstance(num_steps, bool) or not isinstance(num_steps, int) or num_steps < 1:
        raise ValueError(f"num_steps: must be an integer >= 1, got {num_steps!r}")
    if not 0 < sigma_min <= sigma_max:
        raise ValueError(
            f"sigma_min/sigma_max: need 0 < sigma_min <= sigma_max, got {sigma_min}, {sigma_max}"
        )
    if rho <= 0:
        raise ValueError(f"rho: must be positive, got {rho}")
    i = torch.arange(num_steps, dtype=torch.float64, device=device)  # (N,)
    ramp = i / (num_steps - 1) if num_steps > 1 else i  # (N,) in [0, 1]
    lo, hi = sigma_min ** (1.0 / rho), sigma_max ** (1.0 / rho)
    t = (hi + ramp * (lo - hi)) ** rho  # (N,)  EDM eq. 5
    t = torch.cat([t, t.new_zeros(1)])  # (N + 1,)  t_N = 0
    return t.to(dtype)


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """At least float32 (bf16/fp16 inputs get float32 coefficients; float64 stays float64)."""
    return torch.promote_types(dtype, torch.float32) if dtype.is_floating_point else torch.float32


def _batch_sigma(sigma: float | Tensor, x: Tensor, dtype: torch.dtype) -> Tensor:
    """Noise level as a (B,) tensor of ``dtype`` on ``x.device`` (scalars are broadcast)."""
    sigma = torch.as_tensor(sigma, dtype=dtype, device=x.device)
    if sigma.ndim == 0:
        sigma = sigma.expand(x.shape[0])
    if sigma.shape != (x.shape[0],):
        raise ValueError(
            f"sigma: expected a scalar or shape ({x.shape[0]},) matching the batch of x "
            f"{tuple(x.shape)}, got {tuple(sigma.shape)}"
        )
    return sigma


def _bcast(v: Tensor, x: Tensor) -> Tensor:
    """(B,) -> (B, 1, ..., 1) so it broadcasts over the non-batch dims of ``x``; a ``v`` with
    ``x``'s number of dims (e.g. a level per frame, (B, 1, T, 1, 1)) as it is."""
    return v if v.ndim == x.ndim else v.reshape(-1, *([1] * (x.ndim - 1)))


class EDM:
    """EDM preconditioning and loss (Karras et al. 2022, Table 1, "Ours" column).

    Build it with :func:`~vfm_core.diffusion.objective.create_diffusion` or ``EDM(cfg)``.
    """

    __slots__ = ("cfg", "sigma_data", "p_mean", "p_std")

    def __init__(self, cfg: DiffusionConfig) -> None:
        if cfg.sigma_data <= 0:
            raise ValueError(f"sigma_data: must be positive, got {cfg.sigma_data}")
        if cfg.p_std < 0:
            raise ValueError(f"p_std: must be >= 0, got {cfg.p_std}")
        self.cfg = cfg
        self.sigma_data = float(cfg.sigma_data)
        self.p_mean = float(cfg.p_mean)
        self.p_std = float(cfg.p_std)

    def __repr__(self) -> str:
        return f"EDM(sigma_data={self.sigma_data}, p_mean={self.p_mean}, p_std={self.p_std})"

    # ------------------------------------------------------------------ preconditioning
    def precondition(self, sigma: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """Preconditioning coefficients of EDM Table 1 for noise levels ``sigma`` (B,).

        Returns ``(c_skip, c_out, c_in, c_noise)``, each of sigma's shape (B,)::

            c_skip  = sd^2 / (sigma^2 + sd^2)
            c_out   = sigma * sd / sqrt(sigma^2 + sd^2)
            c_in    = 1 / sqrt(sigma^2 + sd^2)
            c_noise = ln(sigma) / 4

        Computed in float32 (float64 if ``sigma`` is float64).
        """
        sigma = torch.as_tensor(sigma)
        sigma = sigma.to(compute_dtype(sigma.dtype))  # (B,)
        sd = self.sigma_data
        var = sigma**2 + sd**2  # (B,)
        c_skip = sd**2 / var
        c_out = sigma * sd / var.sqrt()
        c_in = var.rsqrt()
        c_noise = sigma.log() / 4
        return c_skip, c_out, c_in, c_noise

    def denoise(self, net: Net, x: Tensor, sigma: float | Tensor, text: Any) -> Tensor:
        """Denoiser ``D(x; sigma) = c_skip x + c_out F(c_in x; c_noise)`` (EDM eq. 7, Table 1).

        Args:
            net: raw network ``net(x_in, c_noise, text) -> F``.
            x: (B, ...) noisy latent, e.g. (B, C, T, H, W).
            sigma: (B,) per-sample noise level (a scalar is broadcast over the batch).
            text: (B, L, Dt) caption embeddings, passed to ``net`` untouched.

        Returns:
            (B, ...) denoised estimate in float32 (float64 if ``x`` is float64).
        """
        dtype = compute_dtype(x.dtype)
        sigma = _batch_sigma(sigma, x, dtype)  # (B,)
        c_skip, c_out, c_in, c_noise = self.precondition(sigma)  # each (B,)
        x = x.to(dtype)  # (B, C, T, H, W)
        f = net(_bcast(c_in, x) * x, c_noise, text)  # (B, C, T, H, W)
        if f.shape != x.shape:
            raise ValueError(f"net output: expected shape {tuple(x.shape)}, got {tuple(f.shape)}")
        return _bcast(c_skip, x) * x + _bcast(c_out, x) * f.to(dtype)

    # ------------------------------------------------------------------ training
    def loss_weight(self, sigma: Tensor) -> Tensor:
        """Loss weight lambda(sigma) = (sigma^2 + sd^2) / (sigma * sd)^2 (EDM Table 1).

        Note lambda(sigma) * c_out(sigma)^2 = 1, i.e. the effective weight on the raw network
        output F is uniform over noise levels (EDM Sec. 5, eq. 8).
        """
        sigma = torch.as_tensor(sigma)
        sigma = sigma.to(compute_dtype(sigma.dtype))
        sd = self.sigma_data
        return (sigma**2 + sd**2) / (sigma * sd) ** 2

    def log_sigma_normal(self) -> tuple[float, float]:
        """(mean, std) of the normal that ln(sigma) of the training noise levels follows."""
        return self.p_mean, self.p_std

    def sampling_sigmas(self, num_steps: int) -> Tensor:
        """Descending noise levels of the sampler, ending in 0: EDM's Karras schedule."""
        c = self.cfg
        return karras_sigmas(num_steps, sigma_min=c.sigma_min, sigma_max=c.sigma_max, rho=c.rho)

    def sample_sigma(
        self,
        batch: int,
        *,
        generator: torch.Generator | None = None,
        device: torch.device | str | None = None,
    ) -> Tensor:
        """Training noise levels ln(sigma) ~ N(P_mean, P_std^2) (EDM Table 1), shape (batch,).

        The normal draw is made on the generator's device (so a CPU generator works for CUDA
        training) and moved to ``device``; float32.
        """
        gen_device = generator.device if generator is not None else device
        n = torch.randn(batch, generator=generator, device=gen_device)  # (B,)
        mean, std = self.log_sigma_normal()
        return (mean + std * n).exp().to(device)

    def training_pair(self, x0: Tensor, sigma: Tensor, noise: Tensor) -> tuple[Tensor, Tensor]:
        """(x_in, target) of training examples: the network input ``c_in x`` of the noisy
        ``x = x0 + sigma noise`` and the raw output F that makes the denoiser exact,
        ``(x0 - c_skip x) / c_out``.

        Since ``lambda(sigma) c_out(sigma)^2 = 1`` (Table 1; rectified flow's weight likewise),
        EDM's weighted loss ``lambda |D(x; sigma) - x0|^2`` equals ``|F - target|^2``: the one
        formula :meth:`loss`, packed training and every pipeline stage use. ``sigma`` holds one
        level per index of x0's first dimension (a sample, or a packed token), or broadcasts
        like x0 (a level per latent frame: (B, 1, T, 1, 1)); computed in float32 (float64 for
        float64 inputs).
        """
        dtype = compute_dtype(x0.dtype)
        sigma = torch.as_tensor(sigma, dtype=dtype, device=x0.device)  # (B,)
        c_skip, c_out, c_in, _ = self.precondition(sigma)  # each (B,)
        x0 = x0.to(dtype)
        x = x0 + _bcast(sigma, x0) * noise.to(dtype)  # (B, ...) noisy
        return _bcast(c_in, x0) * x, (x0 - _bcast(c_skip, x0) * x) / _bcast(c_out, x0)

    def loss(self, net: Net, x0: Tensor, text: Any, *, sigma: Tensor, noise: Tensor) -> Tensor:
        """Per-sample EDM loss (EDM eq. 2 with the weighting of Table 1), shape (B,):
        ``lambda(sigma) * mean_{non-batch dims} (D(x0 + sigma * noise; sigma) - x0)^2``,
        computed as ``mean (F - target)^2`` (:meth:`training_pair`).

        Deterministic given its inputs: the caller owns the RNG and passes ``sigma`` (B,) and
        ``noise`` (same shape as ``x0``, standard normal). See :meth:`training_losses` for a
        convenience that draws both.

        Args:
            net: raw network ``net(x_in, c_noise, text) -> F``.
            x0: (B, ...) clean latents, already scaled by :func:`scale_latents`.
            text: (B, L, Dt) caption embeddings (null embeddings for dropped captions).
            sigma: (B,) noise levels.
            noise: (B, ...) standard normal noise, same shape as ``x0``.
        """
        if noise.shape != x0.shape:
            raise ValueError(
                f"noise: expected the shape of x0 {tuple(x0.shape)}, got {tuple(noise.shape)}"
            )
        dtype = compute_dtype(x0.dtype)
        sigma = _batch_sigma(sigma, x0, dtype)  # (B,)
        x_in, target = self.training_pair(x0, sigma, noise)  # (B, C, T, H, W) each
        f = net(x_in, self.precondition(sigma)[3], text)  # (B, C, T, H, W)
        if f.shape != x0.shape:
            raise ValueError(f"net output: expected shape {tuple(x0.shape)}, got {tuple(f.shape)}")
        return (f.to(dtype) - target).square().flatten(1).mean(dim=1)  # (B,)

    def training_losses(
        self, net: Net, x0: Tensor, text: Any, *, generator: torch.Generator | None = None
    ) -> tuple[Tensor, Tensor]:
        """Draw sigma (B,) then noise (like ``x0``) from ``generator`` and return (loss, sigma).

        Both draws happen on the generator's device and are moved to ``x0.device``; the loss is
        per sample, shape (B,) (reduce it yourself).
        """
        sigma = self.sample_sigma(x0.shape[0], generator=generator, device=x0.device)  # (B,)
        gen_device = generator.device if generator is not None else x0.device
        noise = torch.randn(
            x0.shape, generator=generator, device=gen_device, dtype=compute_dtype(x0.dtype)
        ).to(x0.device)  # (B, C, T, H, W)
        return self.loss(net, x0, text, sigma=sigma, noise=noise), sigma

    # ------------------------------------------------------------------ latent scaling
    def scale_latents(self, z: Tensor, mean: float | Tensor, std: float | Tensor) -> Tensor:
        """:func:`scale_latents` with this EDM's ``sigma_data``."""
        return scale_latents(z, mean, std, sigma_data=self.sigma_data)

    def unscale_latents(self, x: Tensor, mean: float | Tensor, std: float | Tensor) -> Tensor:
        """:func:`unscale_latents` with this EDM's ``sigma_data``."""
        return unscale_latents(x, mean, std, sigma_data=self.sigma_data)
