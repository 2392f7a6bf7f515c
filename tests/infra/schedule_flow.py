"""A tiny flow that tests/infra/test_schedule_e2e.py deploys on a short schedule; the process worker
runs it from the repository checkout (entrypoint ``tests/infra/schedule_flow.py:tick``)."""

from __future__ import annotations

from prefect import flow


@flow(name="schedule-tick", log_prints=True)
def tick() -> str:
    print("tick")
    return "tick"
