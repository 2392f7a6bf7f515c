"""Retried tasks retry what may pass (a store or node that did not answer), never an error of the
user's input: that failed the same way two more times, seconds later (an empty curate SRC, no S3
credentials, a config key that does not exist)."""

from __future__ import annotations

import importlib
import pkgutil

from prefect import Task

import tasks
from tasks.retry import input_error, unless_input_error
from vfm_core.config import ConfigError
from vfm_core.storage import StorageError
from vfm_core.tracking import TrackingServerDown


def test_input_errors_are_not_retried_and_outages_are():
    class NoCredentialsError(Exception):  # botocore's, by class name
        pass

    class EndpointConnectionError(Exception):
        pass

    for e in (StorageError("raw", "no video files found"), ConfigError("x"), NoCredentialsError()):
        assert input_error(e), e
    down = TrackingServerDown("MLflow tracking URI http://127.0.0.1:1: no server answers")
    for e in (EndpointConnectionError("down"), ConnectionResetError(), TimeoutError(), down):
        assert not input_error(e), e


def test_every_retried_task_retries_only_what_may_pass():
    retried = []
    for info in pkgutil.iter_modules(tasks.__path__):
        module = importlib.import_module(f"tasks.{info.name}")
        for obj in vars(module).values():
            if isinstance(obj, Task) and obj.retries and obj.__module__ == module.__name__:
                retried.append(obj.name)
                assert obj.retry_condition_fn is not None, obj.name
    assert {"curate-discover", "shard", "mlflow-run"} <= set(retried)
    from tasks.curate import discover_task

    assert discover_task.retry_condition_fn is unless_input_error
