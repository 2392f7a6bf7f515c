"""Data: shards (writer, index, reader), the savable loader, packing, buckets and blending.

``vfm_core.data.build_loader(shards=..., seed=..., dp_rank=..., dp_size=..., num_workers=...,
max_tokens=...)`` is the public entry point (imported lazily: it pulls in torch).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from vfm_core.data.loader import build_loader

__all__ = ["build_loader"]


def __getattr__(name: str) -> Any:
    if name == "build_loader":
        from vfm_core.data.loader import build_loader

        return build_loader
    raise AttributeError(f"module 'vfm_core.data' has no attribute {name!r}")
