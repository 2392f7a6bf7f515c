from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def prefect_api():
    """One ephemeral Prefect API for all flow tests (~15 s to come up on this machine)."""
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=120):
        yield
