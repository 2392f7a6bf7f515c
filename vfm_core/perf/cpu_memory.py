"""glibc malloc settings for training steps on the CPU: freed activations stay in the heap.

A CPU training step frees and re-allocates the same few hundred MB every step (activations,
gradients). With glibc's defaults the heap's top is given back to the kernel once more than a
(dynamic) trim threshold is free, and blocks above a (dynamic) mmap threshold are mapped and
unmapped per allocation; the next step then touches fresh pages, one minor page fault per 4 KiB.
Measured (``benchmarks/peers.py``, width 768, 6 models racing in one process): the recipe
trainer's first step of each round took 20-80 thousand faults and ~1 s more than the next
(0.92x its plain loop); with the two thresholds fixed, ~0.2 s (0.98x). A fixed mmap threshold
at glibc's maximum (32 MiB) and a raised trim threshold keep that memory mapped: the heap
stays at the step's peak, which the next step needs again anyway.

What stays mapped is bounded per machine, not per process: the trim threshold is a budget of
:func:`trim_budget` bytes (2 GiB, or 1/16 of the machine's memory when that is less) split over
the ranks on this machine (``LOCAL_WORLD_SIZE``). Four FSDP ranks of a large model each keeping
2 GiB of freed heap had pushed a 24 GiB machine into the OOM killer (issue 45). Blocks above
32 MiB (a large model's weights, gathered blocks, activations) are always mapped and unmapped
per allocation, so they are never held.

The settings are process-wide and permanent (glibc then stops adapting both thresholds), as
``MALLOC_MMAP_THRESHOLD_`` / ``MALLOC_TRIM_THRESHOLD_`` in the environment would make them (a
user's own such settings stand: then nothing is set); applied once, by
:class:`vfm_core.train.trainer.Trainer` on a CPU device. A GPU step's tensors live in torch's
caching allocator instead, so nothing is set there. No-op (False) off glibc.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys

M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
"""glibc's ``mallopt`` parameter numbers (malloc.h)."""

MMAP_THRESHOLD = 32 * 2**20
"""Blocks from the heap up to this size (glibc's largest allowed mmap threshold)."""
MAX_TRIM = 2**31 - 1
"""The largest trim threshold (mallopt takes a C int): free bytes at the heap's top kept."""
RAM_SHARE = 16
"""At most 1/RAM_SHARE of the machine's memory is kept freed, over all its ranks."""

USER_SETTINGS = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "GLIBC_TUNABLES")
"""Environment variables by which a user tunes glibc's malloc: when one is set, theirs stand."""

_held: bool | None = None
"""The first call's answer (None: not called yet)."""


def hold_freed_memory() -> bool:
    """Set the two thresholds once per process; True when glibc took them (after the first
    call, the first call's answer). False, setting nothing, when the environment already tunes
    malloc (:data:`USER_SETTINGS`)."""
    global _held
    if _held is None:
        _held = (
            not any(os.environ.get(k) for k in USER_SETTINGS)
            and _mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)
            and _mallopt(M_TRIM_THRESHOLD, trim_budget())
        )
    return _held


def trim_budget(ram_bytes: int | None = None, local_ranks: int | None = None) -> int:
    """This process's trim threshold: min(2 GiB, RAM / :data:`RAM_SHARE`) over the ranks on
    this machine (``LOCAL_WORLD_SIZE``, set by torchrun; else the process group's size, all
    ranks taken as local; 1 without one)."""
    if ram_bytes is None:
        ram_bytes = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    if local_ranks is None:
        local_ranks = int(os.environ.get("LOCAL_WORLD_SIZE") or 0) or _world_size()
    return min(MAX_TRIM, ram_bytes // RAM_SHARE) // max(1, local_ranks)


def _world_size() -> int:
    import torch.distributed as dist

    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def _mallopt(param: int, value: int) -> bool:
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return False
    fn = getattr(libc, "mallopt", None)  # glibc's; musl has none
    if fn is None:
        return False
    fn.argtypes, fn.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return fn(param, value) == 1
