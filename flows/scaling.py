"""Scaling study: train the same preset under a grid of parallel layouts / process counts, one
MLflow run each (tagged ``vfm.study``) nested under the study's parent run, which holds the report
(table + plots) as artifacts: the comparison view of the study.

Thin by design: parameters are pydantic models (the Prefect UI renders the layout list as a form);
each layout is one training task (a torchrun subprocess); the report is one task. Never imports
torch. Runs go one after another: they would otherwise compete for the same cores and skew the
throughput they measure.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prefect import flow
from pydantic import Field, field_validator, model_validator

from flows.forms import NAME_PATTERN, Form, OptionalDegreeFields, folder_name, refuse_owned
from tasks.report import scaling_report_task
from tasks.tracking import end_mlflow_run, start_mlflow_run
from tasks.train import train_model
from vfm_core.config import (
    DEGREES,
    Config,
    ConfigError,
    apply_overrides,
    merge,
    resolve_degrees,
    validate,
)
from vfm_core.recipes import RECIPES, get_recipe
from vfm_core.tracking import (
    LAYOUT_TAG,
    STAGE_TAG,
    STUDY_TAG,
    data_dir,
    layout_label,
    train_run_name,
)


class LayoutSpec(OptionalDegreeFields):
    """One point of the study: process count and the parallel degrees (unset = inferred:
    :class:`flows.forms.OptionalDegreeFields`)."""

    nproc: int = Field(1, ge=1, le=1024, description="processes (GPUs) for this run")

    def degrees(self) -> dict[str, int]:
        return {k: v for k in DEGREES if (v := getattr(self, k, None)) is not None}

    def label(self) -> str:
        return layout_label(self.degrees(), self.nproc)


def _default_layouts() -> list[LayoutSpec]:
    return [
        LayoutSpec(),
        LayoutSpec(nproc=2, dp_shard=2),
        LayoutSpec(nproc=2, tp=2),
        LayoutSpec(nproc=2, cp=2),
    ]


STUDY_KEYS = {
    "train.steps": "steps",
    "train.out_dir": "out_dir",
    "train.ckpt_every": "steps (a study writes no checkpoints)",
    "tracking.experiment": "experiment",
    **{f"parallel.{k}": "layouts" for k in DEGREES},
}
"""Config keys the study sets itself, and the form field that sets them: an override of one
would be replaced silently."""


class ScalingParams(Form):
    """Form of the scaling-study flow."""

    study: str = Field(
        "cpu-scaling",
        min_length=1,
        pattern=NAME_PATTERN,
        description="study name (MLflow tag; letters, digits, _ . -)",
    )
    recipe: str = Field("dit-tiny", description=f"preset: {', '.join(RECIPES)}")
    steps: int = Field(8, ge=3, description="steps per run (the report skips the first 2)")
    layouts: list[LayoutSpec] = Field(default_factory=_default_layouts, min_length=1)
    overrides: list[str] = Field(default_factory=list, description="section.field=value")
    experiment: str = Field("vfm-scaling", description="MLflow experiment")
    out_dir: str = Field(
        "", description="root of the runs ('' = data/scaling/STUDY/FLOW_RUN_NAME: new per run)"
    )

    _study = field_validator("study")(folder_name)

    @field_validator("recipe")
    @classmethod
    def _known_recipe(cls, v: str) -> str:
        get_recipe(v)
        return v

    @model_validator(mode="after")
    def _every_layout_fits(self) -> ScalingParams:
        """Overrides of what the study sets, and a layout that does not fit its processes or
        the model, refused before the first layout trains (naming the layout)."""
        refuse_owned(self.overrides, STUDY_KEYS)
        base = self.base()
        for i, lay in enumerate(self.layouts):
            try:
                resolve_degrees(lay.degrees(), lay.nproc)
                self.layout_config(base, lay, "out")
            except ConfigError as e:
                raise ValueError(f"layouts[{i}] ({lay.label()}, nproc {lay.nproc}): {e}") from None
        return self

    def base(self) -> Config:
        """The recipe with the overrides (a ConfigError naming the key)."""
        return apply_overrides(get_recipe(self.recipe), self.overrides)

    def layout_config(self, base: Config, lay: LayoutSpec, out_dir: str) -> Config:
        """The validated config of one layout's run: weak scaling (the recipe's batch per
        data-parallel rank, times the layout's data-parallel ranks), no checkpoints."""
        layout = merge(base, {"parallel": lay.degrees()}).parallel
        batch = base.data.batch_size * layout.data_parallel(lay.nproc)
        return validate(
            merge(
                base,
                {
                    "data": {"batch_size": batch},
                    "parallel": lay.degrees(),
                    "train": {"steps": self.steps, "out_dir": out_dir, "ckpt_every": 10**9},
                    "tracking": {"experiment": self.experiment},
                },
            )
        )

    def root(self) -> str:
        """out_dir, or a new directory per flow run: data/scaling/STUDY/FLOW_RUN_NAME."""
        if self.out_dir:
            return self.out_dir
        from prefect.runtime import flow_run

        return str(data_dir() / "scaling" / self.study / (flow_run.get_name() or "run"))


@flow(name="scaling-study", log_prints=True)
def scaling_flow(params: ScalingParams) -> dict[str, Any]:
    base = params.base()
    tracking = validate(merge(base, {"tracking": {"experiment": params.experiment}})).tracking
    _refuse_earlier_runs(params.root())
    # the study is one parent run (the comparison table and plots) with a child run per layout
    parent = start_mlflow_run(
        tracking,
        {STUDY_TAG: params.study, STAGE_TAG: "scaling-study", "recipe": params.recipe},
        name=f"study {params.study}: {params.recipe} x {len(params.layouts)} layouts",
    )
    try:
        runs = _train_layouts(params, base, parent)
        report = scaling_report_task(params.study, f"{params.root()}/report", tracking, parent)
    except BaseException as e:
        end_mlflow_run(tracking, parent, error=str(e))
        raise
    end_mlflow_run(tracking, parent)
    print(report["table"])
    return {"study": params.study, "runs": runs, "report": report, "mlflow_run_id": parent}


def _refuse_earlier_runs(root: str) -> None:
    """A root that holds an earlier study's runs (``NN-LAYOUT/``) is refused before any work: the
    runs would stop at their checkpoints; a default root is new per flow run."""
    if Path(root).is_file():
        raise ValueError(f"out_dir {root}: is a file; name a folder for the study's runs")
    earlier = sorted(p.name for p in Path(root).glob("[0-9][0-9]-*") if p.is_dir())
    if earlier:
        raise ValueError(
            f"out_dir {root} already holds the runs of an earlier study ({', '.join(earlier)}); "
            "leave out_dir empty (a new folder per run) or name another"
        )


def _train_layouts(params: ScalingParams, base, parent: str) -> list[dict[str, Any]]:
    runs = []
    for i, lay in enumerate(params.layouts):
        name = f"{i:02d}-{lay.label()}"
        cfg = params.layout_config(base, lay, f"{params.root()}/{name}")
        tags = {
            STUDY_TAG: params.study,
            LAYOUT_TAG: lay.label(),
            "recipe": params.recipe,
            "nproc": str(lay.nproc),
        }
        run_id = start_mlflow_run(
            cfg.tracking,
            tags,
            parent_run_id=parent,
            name=train_run_name(params.recipe, lay.degrees(), params.steps, lay.nproc),
        )
        summary = train_model(
            cfg, cfg.train.out_dir, mlflow_run_id=run_id, nproc=lay.nproc, degrees=lay.degrees()
        )
        runs.append(
            {
                "layout": lay.label(),
                "nproc": lay.nproc,
                "mlflow_run_id": run_id,
                "final": summary["final"],
            }
        )
    return runs


if __name__ == "__main__":
    from flows.entry import run_main

    run_main(lambda: scaling_flow(ScalingParams()), name="flows.scaling")
