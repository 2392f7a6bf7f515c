"""When a failed task is worth retrying: :func:`unless_input_error`, the ``retry_condition_fn`` of
every retried task. Retries are for what passes (a store or node that did not answer); an error of
the user's input fails the same way each time, so it fails at once, named, not after the retries.
"""

from __future__ import annotations

from vfm_core.errors import UserError
from vfm_core.storage import remote_failure
from vfm_core.tracking import TrackingServerDown

INPUT_ERRORS = (
    UserError,  # names the input: StorageError, RayClusterError, ...
    ValueError,  # ConfigError and pydantic's ValidationError among them
    TypeError,
    FileNotFoundError,
    NotADirectoryError,
    IsADirectoryError,
    PermissionError,
)


def input_error(e: BaseException) -> bool:
    """Whether ``e`` is the user's input's fault: a retry would fail the same way."""
    if isinstance(e, TrackingServerDown):  # a server that may come back
        return False
    if isinstance(e, INPUT_ERRORS):
        return True
    reason = remote_failure(e)
    return reason is not None and "credentials" in reason  # no S3 credentials: not transient


def unless_input_error(task, task_run, state) -> bool:
    """Prefect retry condition: retry unless the failure is :func:`input_error`."""
    try:
        state.result()
    except Exception as e:
        return not input_error(e)
    return True
