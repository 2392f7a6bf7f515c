"""The diffusion objective of a config: :func:`create_diffusion` builds EDM or rectified flow,
both in the interface of :class:`~vfm_core.diffusion.edm.EDM`."""

from __future__ import annotations

from vfm_core.config import DiffusionConfig
from vfm_core.diffusion.edm import EDM
from vfm_core.diffusion.rectified_flow import RectifiedFlow

__all__ = ["create_diffusion"]


def create_diffusion(cfg: DiffusionConfig | None = None) -> EDM:
    """Single entry point (cf. DiT's ``create_diffusion``): the objective of ``cfg`` (default
    config): :class:`EDM`, or :class:`~vfm_core.diffusion.rectified_flow.RectifiedFlow` in the
    same interface."""
    cfg = cfg if cfg is not None else DiffusionConfig()
    if cfg.objective == "rectified_flow":
        return RectifiedFlow(cfg)
    return EDM(cfg)
