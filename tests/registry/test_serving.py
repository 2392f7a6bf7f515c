"""Serving a registered version (slow: servers in subprocesses): ``mlflow models serve -m
models:/vfm-dit-tiny@champion`` answers ``/invocations`` with a video, and the registry works
against an http tracking server (``mlflow server``) as against the sqlite store."""

from __future__ import annotations

import base64
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from registry_support import SMALL, training_run

from vfm_core.checkpoints.uri import resolve_model_uri
from vfm_core.registry import promote, register_checkpoint
from vfm_core.video.io import decode_frames

pytestmark = pytest.mark.slow
NAME = "vfm-dit-tiny"
GOOD = {"prompt_colour_acc": 0.5, "prompt_direction_acc": 0.5, "frechet_distance": 10.0}
MLFLOW = str(Path(sys.executable).parent / "mlflow")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(argv: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen:
    """A server in its own process group (killed with it), its output in ``log``."""
    with log.open("wb") as f:
        return subprocess.Popen(
            argv, stdout=f, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=20)


def wait_healthy(url: str, proc: subprocess.Popen, log: Path, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"{url}: server exited {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            urllib.request.urlopen(url, timeout=5).close()
            return
        except (urllib.error.URLError, OSError):
            time.sleep(1)
    pytest.fail(f"{url}: not healthy after {timeout} s:\n{log.read_text()[-3000:]}")


def test_models_serve_answers_invocations_with_a_video(trained_run, store, tmp_path):
    register_checkpoint(trained_run, run_id=training_run(store), tracking=store, metrics=GOOD)
    promote(NAME, 1)
    port = free_port()
    log = tmp_path / "serve.log"
    argv = [MLFLOW, "models", "serve", "-m", f"models:/{NAME}@champion"]
    argv += ["--env-manager", "local", "-h", "127.0.0.1", "-p", str(port), "-w", "1"]
    # mlflow models serve runs `uvicorn` from the PATH: this environment's bin first
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    proc = start(argv, log, {**os.environ, "OMP_NUM_THREADS": "1", "PATH": path})
    try:
        wait_healthy(f"http://127.0.0.1:{port}/ping", proc, log)
        body = {"dataframe_records": [{"prompt": "a red circle moving right", **SMALL}]}
        req = urllib.request.Request(
            f"http://127.0.0.1:{port}/invocations",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=300) as r:
            answer = json.loads(r.read())
    finally:
        stop(proc)
    (row,) = answer["predictions"]
    assert (row["frames"], row["height"], row["width"]) == (5, 32, 32)
    mp4 = tmp_path / "served.mp4"
    mp4.write_bytes(base64.b64decode(row["mp4_base64"]))
    assert decode_frames(str(mp4)).shape == (5, 32, 32, 3)


def test_registry_against_an_http_tracking_server(trained_run, store, tmp_path, monkeypatch):
    import mlflow

    from vfm_core.cli import main

    port = free_port()
    log = tmp_path / "server.log"
    argv = [MLFLOW, "server", "--host", "127.0.0.1", "--port", str(port), "--workers", "1"]
    argv += ["--backend-store-uri", f"sqlite:///{tmp_path / 'server.db'}"]
    argv += ["--artifacts-destination", str(tmp_path / "server-artifacts")]
    proc = start(argv, log, dict(os.environ))
    uri = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(f"{uri}/health", proc, log)
        monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
        mlflow.set_tracking_uri(uri)
        reg = register_checkpoint(
            trained_run, run_id=training_run(store), tracking=store, metrics=GOOD
        )
        assert promote(NAME, reg.version)["promoted"]
        res = resolve_model_uri(f"models:/{NAME}@champion")  # downloaded through the server
        assert (res.checkpoint / "config.yaml").is_file() and res.tokenizer is not None
        assert res.root.is_relative_to(tmp_path / "cache")
        out = tmp_path / "http.mp4"
        argv = ["generate", "--checkpoint", f"models:/{NAME}@champion", "--prompt", "a red disc"]
        argv += ["--frames", "5", "--size", "32x32", "--steps", "2", "--out", str(out)]
        assert main(argv) == 0
        assert decode_frames(str(out)).shape == (5, 32, 32, 3)
    finally:
        stop(proc)
