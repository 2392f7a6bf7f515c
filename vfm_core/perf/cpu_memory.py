"""glibc malloc settings for training steps on the CPU: freed activations stay in the heap.

A CPU training step frees and re-allocates the same few hundred MB every step (activations,
gradients). With glibc's defaults the heap's top is given back to the kernel once more than a
(dynamic) trim threshold is free, and blocks above a (dynamic) mmap threshold are mapped and
unmapped per allocation; the next step then touches fresh pages, one minor page fault per 4 KiB.
Measured (``benchmarks/peers.py``, width 768, 6 models racing in one process): the recipe
trainer's first step of each round took 20-80 thousand faults and ~1 s more than the next
(0.92x its plain loop); with the two thresholds fixed, ~0.2 s (0.98x). A fixed mmap threshold
at glibc's maximum (32 MiB) and a trim threshold of 2 GiB keep that memory mapped: the heap
stays at the step's peak, which the next step needs again anyway.

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
TRIM_THRESHOLD = 2**31 - 1
"""Free bytes at the heap's top before it is given back (mallopt takes a C int)."""

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
            and _mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD)
        )
    return _held


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
