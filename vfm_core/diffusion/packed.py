"""EDM training loss on a packed sequence: several samples in one token sequence, each with its
own noise level (Karras et al. 2022, eq. 2 with the Table 1 weighting, per sample), in the form
``|F - target|^2`` of :meth:`~vfm_core.diffusion.edm.EDM.training_pair`.

Model-agnostic like :mod:`vfm_core.diffusion.edm`: the network is a callable on packed tokens::

    net(x_in, c_noise, text) -> F
        x_in:    (N, F)  preconditioned noisy tokens of the whole pack (padding included)
        c_noise: (S,)    per-sample noise conditioning ln(sigma) / 4
        text:    anything, passed through (e.g. captions and their lengths)
        F:       (N, F)  raw network output

e.g. ``lambda x, c, t: model.forward_packed(x, c, t, lengths, layout)``. The preconditioning
coefficients are expanded per token from the sample's sigma; the per-token squared error of F
(mean over the F features) is averaged per sample: a sample's value
equals the batched :meth:`EDM.loss` of that sample alone (a token's features are a permutation
of its latent patch, so the mean over a sample's tokens is the mean over its latent). Reduce the
(S,) result with ``.mean()`` so a long video does not outweigh an image by its token count.
Padding tokens (id -1) get sigma = sigma_data (finite coefficients) and are left out of every mean.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from vfm_core.diffusion.edm import EDM, compute_dtype
from vfm_core.geometry import per_sample_mean

PackedNet = Callable[[Tensor, Tensor, Any], Tensor]
"""Raw network on a pack ``net(x_in (N, F), c_noise (S,), text) -> F (N, F)``."""

__all__ = ["PackedNet", "packed_loss", "packed_training_pair"]


def _check_ids(sample_ids: Tensor, n_tokens: int, n_samples: int) -> Tensor:
    """Validate the pack's token -> sample ids; returns the token count of every sample (S,)."""
    if sample_ids.shape != (n_tokens,) or sample_ids.dtype not in (torch.int32, torch.int64):
        raise ValueError(
            f"sample_ids: expected integer shape ({n_tokens},), got {sample_ids.dtype} "
            f"{tuple(sample_ids.shape)}"
        )
    valid = sample_ids[sample_ids >= 0]
    if valid.numel() and int(valid.max()) >= n_samples:
        raise ValueError(
            f"sample_ids: id {int(valid.max())} but sigma has only {n_samples} samples"
        )
    counts = torch.bincount(valid, minlength=n_samples)  # (S,)
    if bool((counts == 0).any()):
        empty = torch.nonzero(counts == 0).flatten().tolist()
        raise ValueError(f"sample_ids: samples {empty} have no token in the pack")
    return counts


def packed_loss(
    edm: EDM,
    net: PackedNet,
    x0: Tensor,
    text: Any,
    *,
    sigma: Tensor,
    noise: Tensor,
    sample_ids: Tensor,
) -> Tensor:
    """Per-sample EDM loss of one pack, shape (S,).

    Args:
        edm: the EDM (sigma_data and the weighting).
        net: raw network on packed tokens (see the module docstring).
        x0: (N, F) clean packed tokens (padding rows are ignored).
        text: passed to ``net`` untouched.
        sigma: (S,) noise level of every sample.
        noise: (N, F) standard normal noise, same shape as ``x0``.
        sample_ids: (N,) sample of every token, -1 for padding.
    """
    if x0.ndim != 2 or noise.shape != x0.shape:
        raise ValueError(
            f"x0 and noise: expected the same (N, F) shape, got {tuple(x0.shape)} and "
            f"{tuple(noise.shape)}"
        )
    dtype = compute_dtype(x0.dtype)
    sigma = torch.as_tensor(sigma, dtype=dtype, device=x0.device)
    if sigma.ndim != 1:
        raise ValueError(f"sigma: expected one level per sample (S,), got {tuple(sigma.shape)}")
    _check_ids(sample_ids, x0.shape[0], sigma.shape[0])
    x_in, target = packed_training_pair(edm, x0, sigma, noise, sample_ids)  # (N, F) each
    f = net(x_in, edm.precondition(sigma)[3], text)  # (N, F)
    if f.shape != x0.shape:
        raise ValueError(f"net output: expected shape {tuple(x0.shape)}, got {tuple(f.shape)}")
    token_err = (f.to(dtype) - target).square().mean(dim=1)  # (N,)
    return per_sample_mean(token_err, sample_ids, sigma.shape[0])  # (S,)


def packed_training_pair(
    edm: EDM, x0: Tensor, sigma: Tensor, noise: Tensor, sample_ids: Tensor
) -> tuple[Tensor, Tensor]:
    """(x_in, target) of a pack's tokens (N, F) (:meth:`EDM.training_pair` with every token at
    its sample's sigma (S,); padding tokens (id -1) at sigma_data, finite and ignored)."""
    dtype = compute_dtype(x0.dtype)
    sigma = torch.as_tensor(sigma, dtype=dtype, device=x0.device)  # (S,)
    pad = sample_ids < 0  # (N,)
    sig_tok = sigma[sample_ids.clamp(min=0)].masked_fill(pad, edm.sigma_data)  # (N,)
    return edm.training_pair(x0, sig_tok, noise)
