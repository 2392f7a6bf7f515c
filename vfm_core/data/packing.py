"""Sequence packing of variable-length samples (images and videos of several sizes).

Samples become token sequences of length ``t*h*w`` (their latent grid after patchify). Packing
puts several of them into one sequence of at most ``max_tokens`` (buffered first-fit-decreasing,
see :func:`first_fit_decreasing` and the planner in :mod:`vfm_core.data.plan`); what a pack then
looks like to the model (:class:`~vfm_core.geometry.PackLayout`: ``cu_seqlens``, sample ids,
per-token positions) is the shared token geometry in :mod:`vfm_core.geometry`.

Attention: on CPU a boolean block-diagonal mask through SDPA (flex attention has no CPU backward);
on GPU the same ``cu_seqlens`` feed varlen / flex / TE THD kernels. Context parallelism cuts a
pack into equal contiguous chunks; ring attention visits each key chunk with its block of the same
mask (:mod:`vfm_core.parallel.context`).
"""

from __future__ import annotations

from collections.abc import Sequence


def first_fit_decreasing(lengths: Sequence[int], capacity: int) -> list[list[int]]:
    """Bins of item indices, each with total length <= capacity (FFD; ties by index, so the
    result is a pure function of the input). Items longer than ``capacity`` raise ValueError."""
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    bins: list[list[int]] = []
    free: list[int] = []
    for i in order:
        n = lengths[i]
        if n > capacity:
            raise ValueError(f"item {i} has {n} tokens > capacity {capacity}")
        for b, f in enumerate(free):
            if n <= f:
                bins[b].append(i)
                free[b] -= n
                break
        else:
            bins.append([i])
            free.append(capacity - n)
    return bins
