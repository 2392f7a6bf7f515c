"""The load test's log accounting (infra/load.py): a client's event dropped while the server's
sqlite store was locked is counted apart from errors, and only then."""

from __future__ import annotations

from infra.load import DROPPED_EVENT, LoadReport, contention_apart

DROPPED = f"08:30:03.860 | ERROR | GlobalEventLoopThread | {DROPPED_EVENT} Event(heartbeat)"
OTHER = "08:30:04.000 | ERROR | prefect.flow_runs.worker - flow run failed"


def report(locked: int) -> LoadReport:
    return LoadReport(
        runs=4,
        submit_s=0.1,
        drain_s=120.0,
        states={"COMPLETED": 4},
        run_dirs=[],
        flow_run_ids=[],
        busy_retries=0,
        log_errors={"prefect": [], "worker": [DROPPED, OTHER], "mlflow": []},
        locked={"prefect": locked, "worker": 0, "mlflow": 0},
    )


def test_dropped_events_count_apart_only_under_lock_contention():
    busy = contention_apart(report(locked=3))
    assert busy.log_errors["worker"] == [OTHER]  # any other error stays an error
    assert busy.dropped_events == {"prefect": 0, "worker": 1, "mlflow": 0}
    calm = contention_apart(report(locked=0))
    assert calm.log_errors["worker"] == [DROPPED, OTHER] and calm.dropped_events == {}
