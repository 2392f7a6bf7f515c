"""One place to look, without servers: the record of `make up` decides what a client uses (live
services only, variables the user set win), and subprocess output reaches Prefect logs without
progress-bar redraws."""

from __future__ import annotations

import json
import os

import pytest

from tasks.logs import log_lines
from vfm_core.infra_env import running_services, use_running_services


@pytest.fixture
def record(tmp_path, monkeypatch):
    for var in ("MLFLOW_TRACKING_URI", "PREFECT_API_URL", "AWS_ENDPOINT_URL", "VFM_NO_SERVICES"):
        monkeypatch.delenv(var, raising=False)
    services = {
        "mlflow": {"pid": os.getpid(), "port": 5123, "health": None},  # alive
        "prefect": {"pid": 2**22 + 17, "port": 4321, "health": None},  # not running
        "worker": {"pid": os.getpid(), "port": None, "health": None},
    }
    env = {
        "MLFLOW_TRACKING_URI": "http://127.0.0.1:5123",
        "PREFECT_API_URL": "http://127.0.0.1:4321/api",
    }
    (tmp_path / "services.json").write_text(json.dumps({"services": services, "env": env}))
    return tmp_path


def test_live_services_only(record, monkeypatch):
    assert set(running_services(record)) == {"mlflow", "worker"}
    got = use_running_services(record)
    assert got == {"MLFLOW_TRACKING_URI": "http://127.0.0.1:5123"}
    assert os.environ["MLFLOW_TRACKING_URI"] == "http://127.0.0.1:5123"
    assert "PREFECT_API_URL" not in os.environ  # a dead server is never used


def test_user_settings_win_and_opt_out(record, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "sqlite:///mine.db")
    assert use_running_services(record) == {}
    assert os.environ["MLFLOW_TRACKING_URI"] == "sqlite:///mine.db"
    monkeypatch.delenv("MLFLOW_TRACKING_URI")
    monkeypatch.setenv("VFM_NO_SERVICES", "1")
    assert use_running_services(record) == {} and "MLFLOW_TRACKING_URI" not in os.environ


def test_credentials_follow_their_address(tmp_path, monkeypatch):
    """The Prefect server's auth string and the S3 endpoint's keys are used with that server's
    address only: never sent to a server the user chose, and over the user's own keys where the
    address is the record's (the local endpoint would refuse those)."""
    for var in (
        "PREFECT_API_URL",
        "PREFECT_API_AUTH_STRING",
        "AWS_ENDPOINT_URL",
        "VFM_NO_SERVICES",
    ):
        monkeypatch.delenv(var, raising=False)
    alive = {"pid": os.getpid(), "port": None, "health": None}
    env = {
        "PREFECT_API_URL": "http://127.0.0.1:4321/api",
        "PREFECT_API_AUTH_STRING": "vfm:secret",
        "AWS_ENDPOINT_URL": "http://127.0.0.1:9001",
        "AWS_ACCESS_KEY_ID": "VFMKEY",
        "AWS_SECRET_ACCESS_KEY": "vfmsecret",
    }
    record = {"services": {"prefect": alive, "s3": alive}, "env": env}
    (tmp_path / "services.json").write_text(json.dumps(record))
    monkeypatch.setenv("PREFECT_API_URL", "https://prefect.example.com/api")  # the user's own
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAREAL")  # a real account's, for real S3
    got = use_running_services(tmp_path)
    assert "PREFECT_API_AUTH_STRING" not in got and "PREFECT_API_AUTH_STRING" not in os.environ
    assert got["AWS_ENDPOINT_URL"] == "http://127.0.0.1:9001"
    assert os.environ["AWS_ACCESS_KEY_ID"] == "VFMKEY" == got["AWS_ACCESS_KEY_ID"]
    monkeypatch.delenv("PREFECT_API_URL")
    assert use_running_services(tmp_path)["PREFECT_API_AUTH_STRING"] == "vfm:secret"


def test_no_or_broken_record_is_embedded_defaults(tmp_path):
    """A record that cannot be read, or of another shape, is ignored with one warning naming it
    (a pid "abc" stopped every command, `vfm recipes` too, with a traceback)."""
    assert use_running_services(tmp_path) == {}
    for text in (
        "{not json",
        '{"env": {"MLFLOW_TRACKING_URI": "x"}, "services": {"mlflow": {"pid": "abc"}}}',
        '{"services": [1]}',
        "[]",
    ):
        (tmp_path / "services.json").write_text(text)
        with pytest.warns(UserWarning, match=r"services.json: .*; ignored"):
            assert use_running_services(tmp_path) == {}


def test_log_lines_drop_progress_redraws():
    out = (
        "loading\n\x1b[32mstep 1/4 loss 0.9\x1b[0m\n"
        " 25%|██▌       | 1/4 [00:00<00:01]\r 50%|█████     | 2/4 [00:01<00:01]\r"
        "100%|██████████| 4/4 [00:02<00:00]\n\n done\n"
    )
    assert log_lines(out) == [
        "loading",
        "step 1/4 loss 0.9",
        "100%|██████████| 4/4 [00:02<00:00]",
        " done",
    ]
