"""The GPU FP8 tests' precondition: FP8 runs here, through the backend the test is about."""

from __future__ import annotations

import pytest

from vfm_core.models.fp8 import fp8_backend, fp8_status


def require_fp8_backend(backend: str) -> str:
    """Skip the calling test (with the reason) unless FP8 runs here through ``backend``
    ("te" or "torch"); returns :func:`fp8_status`'s reason."""
    usable, reason = fp8_status()
    if not usable:
        pytest.skip(reason)
    if fp8_backend() != backend:
        pytest.skip(f"FP8 backend here is {fp8_backend()!r}, not {backend!r}: {reason}")
    return reason
