"""Rectified flow (flow matching with straight paths; Liu et al. 2022, Lipman et al. 2022, used by
SD3, Open-Sora 2, Wan) in the interface of :class:`~vfm_core.diffusion.edm.EDM`, so the trainer,
the pipeline stages, packed training and the samplers run it unchanged.

The path ``x_t = (1 - t) x0 + t eps`` (t in [0, 1]) is the EDM variance-exploding path scaled:
with ``sigma = t / (1 - t)``, ``x_t = (x0 + sigma eps) / (1 + sigma)``. So, in EDM's variables
(x = x0 + sigma eps), the network sees ``x_t = c_in x`` with ``c_in = 1 / (1 + sigma)`` and
``c_noise = t``, predicts the velocity ``v = eps - x0``, and the denoiser is
``D = x_t - t v = c_skip x + c_out F`` with ``c_skip = 1 / (1 + sigma)``,
``c_out = -sigma / (1 + sigma)``. The loss weight ``1 / c_out^2`` turns EDM's
``lambda |D - x0|^2`` into the flow-matching loss ``|F - (eps - x0)|^2`` exactly.

Training times: logit-normal, ``logit(t) ~ N(logit_mean, logit_std^2)``; since
``ln sigma = logit(t)`` that is EDM's log-normal sigma draw with (mean, std) =
(logit_mean + ln shift, logit_std), the resolution shift ``t -> k t / (1 + (k - 1) t)`` being
``sigma -> k sigma``. Sampling: uniform steps in t from 1 to 0, shifted the same way; the EDM
Euler step on x is exactly the flow's Euler step ``x_{t'} = x_t + (t' - t) v`` (and Heun its
2nd-order version).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from vfm_core.config import DiffusionConfig
from vfm_core.diffusion.edm import EDM, compute_dtype

T_MAX = 1.0 - 1e-4
"""First sampling time (sigma ~ 1e4): the sample starts from noise at t = 1 up to fp32 range."""


class RectifiedFlow(EDM):
    """Rectified-flow preconditioning, weighting, training times and sampling schedule."""

    __slots__ = ("logit_mean", "logit_std", "shift")

    def __init__(self, cfg: DiffusionConfig) -> None:
        super().__init__(cfg)
        if cfg.shift <= 0:
            raise ValueError(f"shift: must be positive, got {cfg.shift}")
        self.logit_mean, self.logit_std, self.shift = cfg.logit_mean, cfg.logit_std, cfg.shift

    def __repr__(self) -> str:
        return (
            f"RectifiedFlow(logit_mean={self.logit_mean}, logit_std={self.logit_std}, "
            f"shift={self.shift})"
        )

    def precondition(self, sigma: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """``(c_skip, c_out, c_in, c_noise)`` of the module docstring, each (B,)."""
        sigma = torch.as_tensor(sigma)
        sigma = sigma.to(compute_dtype(sigma.dtype))  # (B,)
        one = 1.0 + sigma
        return 1.0 / one, -sigma / one, 1.0 / one, sigma / one  # c_noise = t

    def loss_weight(self, sigma: Tensor) -> Tensor:
        """``1 / c_out^2``: the loss is the plain velocity MSE."""
        sigma = torch.as_tensor(sigma)
        sigma = sigma.to(compute_dtype(sigma.dtype))
        return ((1.0 + sigma) / sigma) ** 2

    def log_sigma_normal(self) -> tuple[float, float]:
        return self.logit_mean + math.log(self.shift), self.logit_std

    def sampling_sigmas(self, num_steps: int) -> Tensor:
        """``t`` uniform from :data:`T_MAX` to 0 in ``num_steps`` steps, shifted, as sigma."""
        if isinstance(num_steps, bool) or not isinstance(num_steps, int) or num_steps < 1:
            raise ValueError(f"num_steps: must be an integer >= 1, got {num_steps!r}")
        t = torch.linspace(T_MAX, 0.0, num_steps + 1, dtype=torch.float64)  # (N + 1,)
        k = self.shift
        t = k * t / (1.0 + (k - 1.0) * t)
        return (t / (1.0 - t)).to(torch.float32)  # (N + 1,), last 0
