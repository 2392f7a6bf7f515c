"""Test-wide environment: every store (MLflow, Prefect, runs) under a per-session temp dir."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

_ROOT = Path(tempfile.mkdtemp(prefix="vfm-tests-"))
os.environ["VFM_DATA_DIR"] = str(_ROOT / "data")
os.environ["PREFECT_HOME"] = str(_ROOT / "prefect")
os.environ["PREFECT_SERVER_ANALYTICS_ENABLED"] = "false"
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120")
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ.pop("MLFLOW_TRACKING_URI", None)
os.environ.pop("MLFLOW_RUN_ID", None)

REPO = Path(__file__).resolve().parents[1]


def pytest_collection_modifyitems(config, items):
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def data_root() -> Path:
    return Path(os.environ["VFM_DATA_DIR"])
