"""Evaluate-and-promote flow: a trained checkpoint -> its evaluation -> a registered version of
``vfm-<recipe>`` -> the ``champion`` alias when the promotion rule holds.

The nightly chain's last decision (deployments/prefect.yaml: train-nightly -> promote-nightly ->
generate-nightly): the same evaluation as the demo's (held-out loss, Fréchet distance, prompt
following; ``flows.generate.evaluated_run``), the same registration and rule
(``tasks.registry.register_and_promote``). It emits ``vfm.promote.completed`` either way, with the
resource label ``vfm.promoted`` ``true`` / ``false``: generate-nightly's trigger matches ``true``
only, so a worse model is registered (and its rejection reason recorded on the version) but never
served. Never imports torch.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prefect import flow
from pydantic import Field

from flows.forms import Form, with_deployment_defaults
from flows.generate import evaluated_run
from tasks.events import emit_stage_completed
from tasks.registry import register_and_promote
from vfm_core.config import TrackingConfig
from vfm_core.tracking import data_dir


class PromoteParams(Form):
    """Form of the evaluate-and-promote flow."""

    checkpoint: str = Field(
        ..., description="run directory written by `vfm train` (its newest intact checkpoint)"
    )
    train_run_id: str | None = Field(
        None,
        description="the training run's MLflow id: the version is logged in it (lineage); "
        "None: a new 'register' run",
    )
    heldout_shards: str = Field(
        "", description="shards the loss and the Fréchet distance compare with ('' = the run's own)"
    )
    tokenizer: str | None = Field(None, description="tokenizer dir (None: the run's)")
    eval_samples: int = Field(16, ge=2, le=1024, description="held-out samples for evaluation")
    eval_prompts: int = Field(
        40, ge=0, le=40, description="vocabulary prompts generated and read back"
    )
    name: str | None = Field(None, description="registered model (None: vfm-<recipe>)")
    tolerance: float = Field(
        0.0,
        ge=0,
        lt=1,
        description="relative slack of the promotion rule (0.05: up to 5% worse still promotes)",
    )
    experiment: str = Field("vfm", description="MLflow experiment of the evaluation run")


@flow(name="evaluate-and-promote", log_prints=True)
def evaluate_and_promote_flow(params: PromoteParams) -> dict[str, Any]:
    """Evaluate ``params.checkpoint`` (MLflow run ``evaluate …`` under the training run),
    register it and apply the promotion rule; returns the version and the decision
    (``tasks.registry.register_and_promote``) with the metrics."""
    params = with_deployment_defaults(params)  # a trigger's run: the deployment's settings
    tracking = TrackingConfig(experiment=params.experiment)
    sheet_dir = data_dir() / "evaluations" / (Path(params.checkpoint.rstrip("/")).name or "run")
    sheet_dir.mkdir(parents=True, exist_ok=True)
    metrics, eval_run, _ = evaluated_run(
        params.checkpoint,
        tracking,
        tags={"source": "prefect", "checkpoint": params.checkpoint},
        parent_run_id=params.train_run_id,
        sheet_dir=sheet_dir,
        tokenizer=params.tokenizer,
        samples=params.eval_samples,
        prompts=params.eval_prompts,
        heldout_shards=params.heldout_shards,
    )
    out = register_and_promote(
        params.checkpoint,
        tracking,
        train_run_id=params.train_run_id,
        metrics=metrics,
        eval_run_id=eval_run,
        name=params.name,
        tokenizer=params.tokenizer,
        rule={"tolerance": params.tolerance},
    )
    verdict = "the new champion" if out["promoted"] else "not promoted"
    print(f"{out['model_uri']}: {verdict} ({out['reason']})")
    keys = ("name", "version", "model_uri", "champion_uri", "promoted", "reason")
    emit_stage_completed(
        "promote",
        {**{k: out[k] for k in keys}, "checkpoint": params.checkpoint, "eval_run_id": eval_run},
        labels={"vfm.promoted": str(bool(out["promoted"])).lower()},
    )
    return {**out, "metrics": metrics, "eval_run_id": eval_run}


if __name__ == "__main__":
    import sys

    from flows.entry import run_main

    run_main(
        lambda: evaluate_and_promote_flow(PromoteParams(checkpoint=sys.argv[1])),
        name="flows.promote",
    )
