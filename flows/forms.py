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
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, create_model

from vfm_core.config import (
    Config,
    ParallelDegrees,
    apply_overrides,
    merge,
    nested,
    override_keys,
    refuse_disagreement,
    validate,
)
from vfm_core.config_fields import form_fields
from vfm_core.recipes import get_recipe

__all__ = [
    "NAME_PATTERN",
    "DegreeFields",
    "Form",
    "OptionalDegreeFields",
    "folder_name",
    "form_config",
    "merged_params",
    "nested",
    "with_deployment_defaults",
]


class Form(BaseModel):
    """Base of every flow form: a key the form does not have is an error naming it (a misspelt
    ``stpes`` trained with the default steps), and numbers are finite (``inf`` passed ``gt=0``
    and failed deep in a task)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


DegreeFields = create_model(
    "DegreeFields", __base__=Form, __module__=__name__, **form_fields(ParallelDegrees)
)
"""Base of a form with the parallel degrees as fields, generated from
:class:`~vfm_core.config.ParallelDegrees` (defaults, bounds, descriptions; dp_shard -1 = what is
left of the ranks, 0 refused)."""

OptionalDegreeFields = create_model(
    "OptionalDegreeFields",
    __base__=Form,
    __module__=__name__,
    **form_fields(ParallelDegrees, optional=True),
)
"""The same, every degree optional: unset (None) = inferred."""


NAME_PATTERN = r"^[A-Za-z0-9_.-]+$"
"""A form's run name: one folder name (no '/')."""


def folder_name(v: str) -> str:
    """Field validator of a name that becomes a folder (with :data:`NAME_PATTERN`): '.' and '..'
    would put the run in its parent folder or above it."""
    if v in (".", ".."):
        raise ValueError(f"{v!r} is not a folder name of its own; use letters, digits, _ . -")
    return v


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


def refuse_owned(overrides: Sequence[str], owned: Mapping[str, str]) -> None:
    """An override of a config key that the form sets from one of its own fields (``owned``:
    dotted key -> the field) is a ValueError naming both: it would be replaced silently, or
    disagree with what the form does with the field."""
    for key, text in override_keys(list(overrides)).items():
        if key in owned:
            raise ValueError(
                f"overrides: {text!r}: {key} is set from the form's {owned[key]}; use that "
                "field and drop the override"
            )


def refuse_conflicts(
    named: Mapping[str, Any],
    below: Config,
    settings: Mapping[str, Any],
    overrides: Sequence[str],
) -> None:
    """A form field the user filled in (``named``: dotted key -> value) and a setting or
    override of the same key with another value (``below``: the config without the fields) is
    a ConfigError naming both (:func:`vfm_core.config.refuse_disagreement`)."""
    given = {k: f"settings {k}: {v!r}" for k, v in settings.items()}
    given |= {k: f"overrides {text!r}" for k, text in override_keys(list(overrides)).items()}
    for key, value in named.items():
        refuse_disagreement(key, value, f"{key}: the form's field says {value!r}", below, given)


def merged_params(defaults: Mapping[str, Any], given: Mapping[str, Any]) -> dict[str, Any]:
    """A form's fields: ``given`` over ``defaults``; a dict field (``settings``) merged key by
    key, so a trigger that names one setting keeps the deployment's others."""
    out = dict(defaults)
    for key, value in given.items():
        base = defaults.get(key)
        both = isinstance(value, Mapping) and isinstance(base, Mapping)
        out[key] = {**base, **value} if both else value
    return out


FormT = TypeVar("FormT", bound=Form)


def with_deployment_defaults(params: FormT) -> FormT:
    """``params`` with every field its flow run was not given taken from the run's deployment's
    own ``params`` (:func:`merged_params`). A deployment trigger passes only what its event
    decides (``clips_dir``, ``checkpoint``); the rest of a nightly stage's settings are its
    deployment's parameters, edited in one place (prefect.yaml or the deployment's page in the
    UI) for runs by hand and by trigger alike. Unchanged outside a deployment's flow run (a run
    by hand without a deployment, a subflow of the pipeline)."""
    from prefect import get_client
    from prefect.context import FlowRunContext

    ctx = FlowRunContext.get()
    deployment_id = getattr(getattr(ctx, "flow_run", None), "deployment_id", None)
    if deployment_id is None:
        return params
    with get_client(sync_client=True) as client:
        deployment = client.read_deployment(deployment_id)
    if deployment.flow_id != ctx.flow_run.flow_id:  # another flow's deployment (a subflow's run)
        return params
    defaults = (deployment.parameters or {}).get("params") or {}
    given = params.model_dump(exclude_unset=True)
    return type(params).model_validate(merged_params(defaults, given))
