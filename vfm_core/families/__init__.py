"""Model families as objects: :func:`family_of` reads a config's architecture once; the trainer,
the planner and the data source factory ask the family (:class:`Family`)."""

from __future__ import annotations

import torch
from torch import nn

from vfm_core.config import Config, ModelConfig
from vfm_core.families.autoregressive import AUTOREGRESSIVE
from vfm_core.families.diffusion import DIFFUSION
from vfm_core.families.family import Family
from vfm_core.models.init import init_parameters

FAMILIES: dict[str, Family] = {f.name: f for f in (DIFFUSION, AUTOREGRESSIVE)}
"""Every family by name."""


def family_of(cfg: Config | ModelConfig) -> Family:
    """The family whose networks include ``cfg``'s ``model.arch`` (its
    :attr:`~vfm_core.config.ModelConfig.family_name`; an unknown arch raises ConfigError)."""
    model = cfg.model if isinstance(cfg, Config) else cfg
    return FAMILIES[model.family_name]


def build_model(
    cfg: ModelConfig, *, device: str | torch.device | None = None, seed: int = 0
) -> nn.Module:
    """The network of ``cfg``'s family (:meth:`Family.build`), initialised from ``seed``
    (:func:`vfm_core.models.init.init_parameters`); ``device="meta"`` builds a 28B model without
    memory and leaves it uninitialised (parallelise, ``to_empty``, then
    ``init_parameters(model, model.init_rule, seed=...)``)."""
    with torch.device(device or "cpu"):
        model = family_of(cfg).build(cfg)
    if torch.device(device or "cpu").type != "meta":
        init_parameters(model, model.init_rule, seed=seed)
    return model


__all__ = [
    "AUTOREGRESSIVE",
    "DIFFUSION",
    "FAMILIES",
    "Family",
    "build_model",
    "family_of",
]
