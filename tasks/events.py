"""Stage events: a flow announces what it wrote when it finishes, so that the next stage can start
from it (the deployment triggers in ``deployments/prefect.yaml``; docs/registry-and-deployments.md).

Chain, each arrow a ``DeploymentEventTrigger`` on the upstream stage's event::

    curate-nightly --vfm.curate.completed--> shard-nightly --vfm.shard.completed-->
    train-nightly --vfm.train.completed--> promote-nightly (evaluation, registry)
    --vfm.promote.completed [vfm.promoted=true]--> generate-nightly (videos of the champion)

The event is sent as the flow's last step, so a flow that fails sends none and the chain stops
there (the failure is the flow run's state in the UI). Its payload holds only what the next stage
needs (output paths, counts, run ids: small, JSON); the Prefect client attaches the flow run, its
flow and its deployment as related resources, which is what the triggers match on.
"""

from __future__ import annotations

from typing import Any, Literal

Stage = Literal["curate", "shard", "train", "promote", "generate"]


def event_name(stage: Stage) -> str:
    """``vfm.STAGE.completed``: the event a finished ``stage`` flow emits."""
    return f"vfm.{stage}.completed"


def emit_stage_completed(
    stage: Stage, payload: dict[str, Any], *, labels: dict[str, str] | None = None
) -> str | None:
    """Emit ``vfm.STAGE.completed`` about this flow run with ``payload`` and extra resource
    ``labels`` (what a trigger's ``match`` can select on: ``vfm.promoted``); the event's id, or
    None where events go nowhere (no API configured)."""
    from prefect.events import emit_event
    from prefect.runtime import flow_run

    run_id = flow_run.get_id() or "local"
    event = emit_event(
        event=event_name(stage),
        resource={
            "prefect.resource.id": f"vfm.{stage}.{run_id}",
            "prefect.resource.name": f"{stage} {flow_run.get_name() or run_id}",
            **(labels or {}),
        },
        payload=payload,
    )
    return None if event is None else str(event.id)
