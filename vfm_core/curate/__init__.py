"""Curation: discover -> probe -> split -> stitch -> transcode -> annotate/filter, as `Stage`s
run by an in-process or a Ray Data executor; `curate(src, dst)` is the entry point."""

from vfm_core.curate.executors import Executor, LocalExecutor, RayExecutor, get_executor
from vfm_core.curate.pipeline import VIDEO_SUFFIXES, assemble, curate, discover, process
from vfm_core.curate.stages import CurateConfig, Stage, build_stages

__all__ = [
    "VIDEO_SUFFIXES",
    "CurateConfig",
    "Executor",
    "LocalExecutor",
    "RayExecutor",
    "Stage",
    "assemble",
    "build_stages",
    "curate",
    "discover",
    "get_executor",
    "process",
]
