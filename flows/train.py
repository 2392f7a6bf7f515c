"""Training flow: validate parameters, create the MLflow run, run the trainer.

Thin by design: parameters are a pydantic model (the Prefect UI renders it as a form) whose fields
map to the typed run config (:func:`flows.forms.form_config`), the work is one task that launches
the trainer process. Never imports torch.
"""

from __future__ import annotations

import os
from typing import Any, Literal

from prefect import flow
from pydantic import Field, create_model, field_validator, model_validator

from flows.forms import (
    DegreeFields,
    form_config,
    nested,
    refuse_conflicts,
    with_deployment_defaults,
)
from tasks.events import emit_stage_completed
from tasks.tracking import end_mlflow_run, start_mlflow_run
from tasks.train import train_model
from vfm_core.config import (
    DEGREES,
    Config,
    merge,
    override_keys,
    resolve_degrees,
    validate,
)
from vfm_core.config_fields import form_fields
from vfm_core.errors import UserError
from vfm_core.launch.launcher import Launch
from vfm_core.recipes import DEFAULT_RECIPE, RECIPES, check_family, get_recipe
from vfm_core.tracking import (
    LAYOUT_TAG,
    STAGE_TAG,
    data_dir,
    layout_label,
    train_run_name,
    ui_hint,
)

Family = Literal["diffusion", "autoregressive"]


def family_field() -> Any:
    return Field(
        "diffusion",
        description="diffusion (DiT over continuous latents) or "
        "autoregressive (causal transformer over discrete tokens); sets the default "
        "recipe",
    )


def recipe_field() -> Any:
    return Field(
        "dit-tiny",
        description=f"preset of the family: {', '.join(RECIPES)} "
        "(default: dit-tiny, ar-tiny for autoregressive)",
    )


def known_recipe(v: str) -> str:
    """Field validator of ``recipe``: ConfigError (a ValueError) naming the known recipes."""
    get_recipe(v)
    return v


def settle_family(params: Any) -> Any:
    """Model validator of a form with ``family`` and ``recipe``: the family's default recipe
    when none was given, and a recipe of another family refused."""
    if "recipe" not in params.model_fields_set:
        params.recipe = DEFAULT_RECIPE[params.family]
    check_family(params.recipe, params.family)
    return params


FIELD_KEYS = {
    "steps": "train.steps",
    "seed": "train.seed",
    "out_dir": "train.out_dir",
    "experiment": "tracking.experiment",
    "init": "train.init",
}
"""The training form's named fields that set a config key (and the parallel degrees)."""


LaunchFields = create_model(
    "LaunchFields",
    __base__=DegreeFields,
    __module__=__name__,
    **form_fields(Launch, ("nproc", "nnodes", "max_restarts")),
)
"""The parallel degrees and the launch fields of the training form, generated from
:class:`~vfm_core.launch.launcher.Launch` (the ``vfm train`` flags: defaults, bounds, help)."""


class TrainParams(LaunchFields):
    """Form of the training flow (the parallel degrees and the launch: :data:`LaunchFields`)."""

    family: Family = family_field()
    recipe: str = recipe_field()
    steps: int = Field(200, ge=1, description="total optimiser steps")
    seed: int = Field(0, ge=0, description="seed for init, sigma and noise")
    out_dir: str = Field(
        "", description="output dir ('' = data/runs/RECIPE/FLOW_RUN_NAME: a new one per run)"
    )
    settings: dict[str, Any] = Field(
        default_factory=dict,
        description="config values by dotted key, typed (e.g. data.source: shards, "
        "data.latent_frames: 5); on top of the recipe, under overrides (a field you fill in "
        "and a setting of the same key must agree)",
    )
    overrides: list[str] = Field(
        default_factory=list, description="section.field=value config overrides (power users)"
    )
    resume: bool = Field(
        False, description="continue from the latest checkpoint in out_dir (needs out_dir)"
    )
    init: str = Field(
        "",
        description="start from a trained model's weights: a run dir, a step_* checkpoint or "
        "models:/NAME@ALIAS (its network unless settings name model keys; new optimizer, step 0; "
        "'' = random weights)",
    )
    experiment: str = Field("vfm", description="MLflow experiment")
    launcher: Literal["local", "slurm"] = Field(
        default_factory=lambda: os.environ.get("VFM_TRAIN_LAUNCHER", "local"),
        description="local: torchrun on the worker's machine; slurm: sbatch the cluster template "
        "(default: the work pool's VFM_TRAIN_LAUNCHER job variable, else local)",
    )

    _family = model_validator(mode="after")(settle_family)

    @field_validator("settings")
    @classmethod
    def _dotted(cls, v: dict[str, Any]) -> dict[str, Any]:
        nested(v)  # every key section.field (the builder checks that they exist, and the types)
        return v

    @model_validator(mode="after")
    def _nodes(self) -> TrainParams:
        if self.nnodes > 1 and self.launcher != "slurm":
            raise ValueError(f"nnodes={self.nnodes}: several nodes need launcher 'slurm'")
        if self.resume and not self.out_dir:
            raise ValueError("resume: name the run to continue in out_dir (each run has its own)")
        return self

    _known_recipe = field_validator("recipe")(known_recipe)

    def to_config(self) -> Config:
        """The typed run config (:func:`flows.forms.form_config`): the recipe, the named fields
        left at their defaults, ``settings``, ``overrides``, then the named fields given; a
        given field and a setting or override of the same key with another value are a
        ConfigError naming both (the field won silently, a default one too)."""
        values = self.field_values()
        fields = {**FIELD_KEYS, **{k: f"parallel.{k}" for k in DEGREES}}
        given = {fields[f] for f in self.model_fields_set if f in fields}
        named = {k: v for k, v in values.items() if k in given}
        defaults = {k: v for k, v in values.items() if k not in given}
        below = form_config(self.recipe, defaults, self.settings, self.overrides)
        refuse_conflicts(named, below, self.settings, self.overrides)
        return validate(merge(below, nested(named)))

    def user_keys(self) -> set[str]:
        """The dotted config keys the form sets: its settings, overrides and the named fields
        filled in (what the data's own settings never replace)."""
        fields = {**FIELD_KEYS, **{k: f"parallel.{k}" for k in DEGREES}}
        named = {fields[f] for f in self.model_fields_set if f in fields}
        return named | set(self.settings) | set(override_keys(self.overrides))

    def field_values(self) -> dict[str, Any]:
        """The form's named fields as config values by dotted key."""
        return {
            "train.steps": self.steps,
            "train.seed": self.seed,
            "train.out_dir": self.resolved_out(),
            "tracking.experiment": self.experiment,
            "train.init": self.init or None,
            **{f"parallel.{k}": v for k, v in self.degrees().items()},
        }

    def degrees(self) -> dict[str, int]:
        return {k: getattr(self, k) for k in DEGREES}

    def resolved_out(self) -> str:
        """out_dir, or a new directory per flow run: data/runs/RECIPE/FLOW_RUN_NAME."""
        if self.out_dir:
            return self.out_dir
        from prefect.runtime import flow_run

        name = flow_run.get_name() or "run"
        return str(data_dir() / "runs" / self.recipe / name)


@flow(name="train", log_prints=True)
def train_flow(
    params: TrainParams | None = None, parent_run_id: str | None = None
) -> dict[str, Any]:
    """Train ``params.recipe`` in the layout of the form; the MLflow run (named after recipe,
    layout and steps) is nested under ``parent_run_id`` (the pipeline's run) when given."""
    params = with_deployment_defaults(params or TrainParams())  # a trigger's: + deployment's
    from vfm_core.checkpoints.init import check_init, with_init_settings
    from vfm_core.families.data_settings import with_data_settings
    from vfm_core.parallel.apply import check_conversions

    try:  # the init model's network, what the shards give the model: as vfm train does
        given = params.user_keys()
        cfg = with_data_settings(with_init_settings(params.to_config(), given), given)
        if not params.resume:
            check_init(cfg)
        check_conversions(cfg)
    except UserError as e:
        raise ValueError(f"train flow parameters: {e}") from None
    run_id = None
    if cfg.tracking.mlflow and not params.resume:
        world = params.nproc * params.nnodes
        degrees = resolve_degrees({k: getattr(cfg.parallel, k) for k in DEGREES}, world)
        label = layout_label(degrees, world)
        run_id = start_mlflow_run(
            cfg.tracking,
            {"recipe": cfg.recipe, "source": "prefect", STAGE_TAG: "train", LAYOUT_TAG: label},
            parent_run_id=parent_run_id,
            name=train_run_name(cfg.recipe, degrees, cfg.train.steps, world),
        )
    try:
        summary = train_model(
            cfg,
            cfg.train.out_dir,
            resume=params.resume,
            mlflow_run_id=run_id,
            nproc=params.nproc,
            max_restarts=params.max_restarts,
            launcher=params.launcher,
            nnodes=params.nnodes,
        )
    except Exception as e:  # every failure path ends the MLflow run, not RUNNING forever
        if run_id is not None:
            end_mlflow_run(cfg.tracking, run_id, error=str(e))
        raise
    final = summary["final"]
    print(
        f"trained {cfg.recipe} to step {summary['step']}: loss {final.get('loss', 0):.4f}, "
        f"MFU {final.get('mfu', 0):.1%}"
    )
    print(f"MLflow run {summary['mlflow_run_id']} -> {ui_hint(cfg.tracking)}")
    emit_stage_completed(
        "train",
        {
            "out_dir": cfg.train.out_dir,
            "recipe": cfg.recipe,
            "step": summary["step"],
            "mlflow_run_id": summary["mlflow_run_id"],
        },
    )
    return summary


if __name__ == "__main__":
    from flows.entry import run_main

    run_main(
        train_flow,
        name="flows.train",
        hint="a new run with resume=True continues from the last checkpoint",
    )
