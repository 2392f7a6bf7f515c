"""A run's config with what its shards give its model filled in (the derivation is
:mod:`vfm_core.tokenizer.run_settings`; the family says whether its model takes the tokenizer's
latent channels or its token ids). ``vfm train`` and the training flow call
:func:`with_data_settings` with the keys the user set, which win."""

from __future__ import annotations

from typing import Any

from vfm_core.config import Config, ConfigError, merge, nested, validate
from vfm_core.families import family_of
from vfm_core.tokenizer.run_settings import dataset_settings


def data_settings(cfg: Config, given: set[str] | frozenset[str] = frozenset()) -> dict[str, Any]:
    """The settings ``cfg``'s shards (``data.shards`` or every dataset of ``data.blend``) give
    its model, less the keys the user set (``given``); {} for synthetic data. Datasets of a
    blend that give a key different values are a ConfigError naming the key and both."""
    if cfg.data.source != "shards":
        return {}
    discrete = family_of(cfg).discrete
    out: dict[str, Any] = {}
    source: dict[str, str] = {}
    for root, _ in cfg.data.datasets():
        found = dataset_settings(root, discrete=discrete, tokenizer=cfg.data.tokenizer)
        for key, value in found.items():
            if key in given:
                continue
            if key in out and out[key] != value:
                raise ConfigError(
                    f"{key}: the datasets of data.blend disagree ({source[key]}: {out[key]!r}, "
                    f"{root}: {value!r}); set {key} for the run"
                )
            out[key] = value
            source.setdefault(key, root)
    return out


def with_data_settings(cfg: Config, given: set[str] | frozenset[str]) -> Config:
    """``cfg`` with the :func:`data_settings` of its shards filled in, except the dotted keys
    the user set (``given``): those win."""
    derived = data_settings(cfg, given)
    return validate(merge(cfg, nested(derived))) if derived else cfg
