"""Swapping named ``nn.Linear`` submodules for other modules in place: how both FP8 backends
(:mod:`vfm_core.models.fp8` for transformer-engine, :mod:`vfm_core.models.fp8_torch`) convert a
model's linears while keeping its parameter names."""

from __future__ import annotations

from collections.abc import Callable

from torch import nn


def swap_linears(model: nn.Module, names: list[str], make: Callable[[nn.Linear], nn.Module]) -> int:
    """Replace each ``nn.Linear`` submodule ``names`` of ``model`` by ``make(old)`` (same
    parameter names: the FP8 linear of either backend); returns how many."""
    for name in names:
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name)
        old = getattr(parent, child)
        if not isinstance(old, nn.Linear):
            raise TypeError(f"swap_linears: {name} is a {type(old).__name__}, not Linear")
        setattr(parent, child, make(old))
    return len(names)
