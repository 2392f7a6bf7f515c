"""The one place that maps a model family to its inference: :data:`GENERATIONS` and
:func:`generation_of` (the interface: :class:`vfm_core.infer.generation.Generation`)."""

from __future__ import annotations

from vfm_core.config import Config, ConfigError
from vfm_core.families import Family, family_of
from vfm_core.infer.diffusion_generation import DiffusionGeneration
from vfm_core.infer.generation import Generation
from vfm_core.infer.token_generation import TokenGeneration

__all__ = ["GENERATIONS", "generation_of"]

GENERATIONS: dict[Family, Generation] = {
    g.family: g for g in (DiffusionGeneration(), TokenGeneration())
}
"""Every family's inference, by family."""


def generation_of(cfg: Config) -> Generation:
    """The inference of ``cfg``'s family (:func:`vfm_core.families.family_of`)."""
    family = family_of(cfg)
    if family not in GENERATIONS:
        raise ConfigError(f"model.arch {cfg.model.arch!r}: the {family.name} family has no sampler")
    return GENERATIONS[family]
