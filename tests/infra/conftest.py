"""One set of ``make up`` servers (``infra/services.py up``: Prefect server, process worker,
MLflow server, S3 endpoint on free loopback ports, state under a temporary folder) for every
module here that only needs them running: starting them costs tens of seconds, so they start
once for this folder's tests (issue #45's CI time) and stop after its last."""

from __future__ import annotations

import pytest

from infra.load import own_servers


@pytest.fixture(scope="package")
def make_up():
    """(temporary folder, client environment read from its ``env.sh``); the worker polls every
    2 s; the caller's own ``PREFECT_API_AUTH_STRING`` is not inherited."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PREFECT_WORKER_QUERY_SECONDS", "2")
        mp.setenv("HF_HUB_OFFLINE", "1")
        mp.delenv("PREFECT_API_AUTH_STRING", raising=False)
        with own_servers("vfm-make-up-") as (root, env):
            yield root, env
