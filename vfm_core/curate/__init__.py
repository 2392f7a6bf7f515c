"""Curation: discover -> probe -> split -> stitch -> transcode -> annotate/filter, as `Stage`s
run by an in-process or a Ray Data executor; `curate(src, dst)` is the entry point.

Names are imported lazily so that `vfm --help` (which registers `vfm curate`) stays fast.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "Executor": "executors",
    "LocalExecutor": "executors",
    "RayExecutor": "executors",
    "get_executor": "executors",
    "VIDEO_SUFFIXES": "inputs",
    "assemble": "pipeline",
    "curate": "pipeline",
    "discover": "inputs",
    "process": "pipeline",
    "CurateConfig": "config",
    "Stage": "stage_base",
    "build_stages": "stages",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(f"vfm_core.curate.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module 'vfm_core.curate' has no attribute {name!r}")
