"""Form fields -> the typed run config: the one mapping every flow form uses.

A form names config values by dotted key with typed values (``{"train.steps": 200,
"data.source": "shards"}``), never as ``section.field=value`` strings; :func:`form_config`
applies them through the config builder (:func:`vfm_core.config.merge`: unknown keys and wrong
types are a ConfigError naming the key) and validates the result like a YAML file or ``--set``
(:func:`vfm_core.config.validate`). A form's free-form ``overrides`` (strings, for power users) are
one more layer, parsed by :func:`vfm_core.config.apply_overrides`. Never imports torch.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from vfm_core.config import Config, ConfigError, apply_overrides, merge, validate
from vfm_core.recipes import get_recipe

__all__ = ["form_config", "nested"]


def nested(values: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """``{"data.shards": "s", "train.steps": 2}`` -> ``{"data": {"shards": "s"}, "train":
    {"steps": 2}}``; a key that is not ``section.field`` is a ConfigError naming it."""
    out: dict[str, dict[str, Any]] = {}
    for key, value in values.items():
        section, _, name = key.partition(".")
        if not section or not name or "." in name:
            raise ConfigError(f"{key}: expected section.field, e.g. train.steps")
        out.setdefault(section, {})[name] = value
    return out


def form_config(recipe: str, *layers: Mapping[str, Any] | Sequence[str]) -> Config:
    """The validated config of ``recipe`` with ``layers`` applied in order, later ones winning:
    each a mapping of dotted keys to typed values (a form's fields) or a list of
    ``section.field=value`` strings (a form's free-form overrides)."""
    cfg = get_recipe(recipe)
    for layer in layers:
        if isinstance(layer, Mapping):
            cfg = merge(cfg, nested(layer))
        else:
            cfg = apply_overrides(cfg, list(layer))
    return validate(cfg)
