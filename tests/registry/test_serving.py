"""Serving a registered version (slow: servers in subprocesses): ``mlflow models serve -m
models:/vfm-dit-tiny@champion``, with this repository out of reach, answers ``/invocations`` with
videos and bad requests with 400 and one line — also in the environment MLflow's default
manager builds from the version's requirements alone —, and the registry works against an http
tracking server (``mlflow server``) as against the sqlite store."""

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

import numpy as np
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


def start(
    argv: list[str], log: Path, env: dict[str, str], cwd: Path | None = None
) -> subprocess.Popen:
    """A server in its own process group (killed with it), its output in ``log``."""
    with log.open("wb") as f:
        return subprocess.Popen(
            argv, stdout=f, stderr=subprocess.STDOUT, env=env, cwd=cwd, start_new_session=True
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


OUT_OF_REACH = """
import builtins, importlib.util, json, os, sys

# this repository out of reach: without the editable install's finder, vfm_core is importable
# from a model folder's code/ or not at all; what vfm_core imports is written to VFM_TEST_IMPORTS
sys.meta_path[:] = [f for f in sys.meta_path if not f.__module__.startswith("__editable__")]
_out, _seen, _import = os.environ["VFM_TEST_IMPORTS"], set(), builtins.__import__


def _write(record):
    with open(_out, "a") as f:
        f.write(json.dumps(record) + "\\n")


def _record(name, globals=None, locals=None, fromlist=(), level=0):
    g = globals or {}
    top = name.partition(".")[0]
    if level == 0 and g.get("__name__", "").startswith("vfm_core") and top not in _seen:
        _seen.add(top)
        _write({"module": top, "by": g.get("__file__")})
    return _import(name, globals, locals, fromlist, level)


_write({"vfm_core_outside_the_model": importlib.util.find_spec("vfm_core") is not None})
builtins.__import__ = _record
"""
BAD_REQUESTS = [
    (
        {"dataframe_records": [{"prompt": "a red disc", "steps": -3}]},
        "row 0, column 'steps': expected an integer in [1, 1000], got -3",
    ),
    (
        {"dataframe_records": [{"prompt": "a red disc", "frames": 2.5}]},
        "row 0, column 'frames': expected an integer >= 1, got 2.5",
    ),
    (
        {"dataframe_records": [{"prompt": "a", **SMALL}, {"prompt": "b", "guidance": "high"}]},
        "row 1, column 'guidance': expected a number in [0, 30], got 'high'",
    ),
    (
        {"dataframe_split": {"columns": ["prompt"], "data": [["a"], [" "]]}},
        "row 1, column 'prompt': expected the text of a prompt (not empty), got ' '",
    ),
    (
        {"inputs": {"prompt": ["a red disc"], "size": ["30x30"]}},
        "row 0: --size 30x30: height must be a multiple of 16 and width of 16 (tokenizer "
        "spatial factor 8 x DiT patch 2x2)",
    ),
]


def post(url: str, body: dict) -> tuple[int, dict]:
    req = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(req, timeout=300) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_models_serve_answers_with_videos_out_of_this_repository(trained_run, store, tmp_path):
    """``mlflow models serve -m models:/vfm-dit-tiny@champion`` run in an empty folder, with no
    PYTHONPATH but a ``sitecustomize`` that takes this repository out of reach (the editable
    install's finder removed): the version serves from the ``vfm_core`` of its model folder,
    every package that vfm_core imports is one of the version's requirements, videos come back
    for good rows and each bad request is answered 400 with the broken rule's line."""
    from importlib.metadata import packages_distributions

    from packaging.utils import canonicalize_name

    from vfm_core.registry.environment import INFERENCE_PACKAGES

    register_checkpoint(trained_run, run_id=training_run(store), tracking=store, metrics=GOOD)
    promote(NAME, 1)
    port = free_port()
    log, site, imports = tmp_path / "serve.log", tmp_path / "site", tmp_path / "imports.jsonl"
    site.mkdir()
    (site / "sitecustomize.py").write_text(OUT_OF_REACH)
    argv = [MLFLOW, "models", "serve", "-m", f"models:/{NAME}@champion"]
    argv += ["--env-manager", "local", "-h", "127.0.0.1", "-p", str(port), "-w", "1"]
    # mlflow models serve runs `uvicorn` from the PATH: this environment's bin first
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PATH": path, "PYTHONPATH": str(site)}
    proc = start(argv, log, {**env, "VFM_TEST_IMPORTS": str(imports)}, cwd=tmp_path)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(f"{url}/ping", proc, log)
        rows = [{"prompt": "a red circle moving right", **SMALL}, {"prompt": "a blue disc"}]
        status, answer = post(f"{url}/invocations", {"dataframe_records": rows})
        assert status == 200, answer
        bad = [post(f"{url}/invocations", body) for body, _ in BAD_REQUESTS]
        no_prompt = post(f"{url}/invocations", {"dataframe_records": [{"steps": 2}]})
    finally:
        stop(proc)
    records = [json.loads(line) for line in imports.read_text().splitlines()]
    assert [r for r in records if r.get("vfm_core_outside_the_model")] == []
    by = {r["by"] for r in records if "by" in r}
    assert by and all("/code/vfm_core/" in f for f in by), by  # the model folder's vfm_core
    dists, listed = packages_distributions(), {canonicalize_name(n) for n in INFERENCE_PACKAGES}
    unlisted = {
        r["module"]: dists[r["module"]]
        for r in records
        if r.get("module") in dists
        and r["module"] not in sys.stdlib_module_names | {"vfm_core"}
        and not listed & {canonicalize_name(d) for d in dists[r["module"]]}
    }
    assert not unlisted, f"vfm_core imports, not in the requirements: {unlisted}"

    served = answer["predictions"]
    assert [(r["frames"], r["height"], r["width"]) for r in served] == [(5, 32, 32)] * 2
    for i, row in enumerate(served):
        mp4 = tmp_path / f"served_{i}.mp4"
        mp4.write_bytes(base64.b64decode(row["mp4_base64"]))
        frames = decode_frames(str(mp4))
        assert frames.shape == (5, 32, 32, 3) and np.isfinite(frames).all()
    for (status, error), (_, line) in zip(bad, BAD_REQUESTS, strict=True):
        assert (status, error["error_code"]) == (400, "INVALID_PARAMETER_VALUE"), error
        # the server puts "Failed to predict data '<the table>'." before the model's own line
        assert error["message"].endswith(f"\nError: {line}"), error["message"]
        assert "stack_trace" not in error and "Traceback" not in error["message"]
    # no prompt column: MLflow's schema check (the signature) answers before the model does
    assert no_prompt[0] == 400 and "Model is missing inputs ['prompt']" in no_prompt[1]["message"]


def _pyenv() -> str | None:
    """The folder of ``pyenv``, which MLflow's default environment manager (virtualenv) needs."""
    import shutil

    found = shutil.which("pyenv") or str(Path.home() / ".pyenv" / "bin" / "pyenv")
    return str(Path(found).parent) if Path(found).is_file() else None


def test_models_serve_builds_its_own_environment_with_the_default_manager(
    trained_run, store, tmp_path
):
    """``mlflow models serve`` with no ``--env-manager`` (MLflow's default, virtualenv) in an
    empty folder with a bare environment (no PYTHONPATH, no project venv on PATH but MLflow's
    own command): MLflow makes a new virtual environment from the version's requirements
    alone (~80 s on this machine, pip's cache and local wheels as the machine has them) and the
    version serves a video from it, and a bad request's one line."""
    bindir = _pyenv()
    if bindir is None:
        pytest.skip("no pyenv: MLflow's virtualenv environment manager needs it")
    register_checkpoint(trained_run, run_id=training_run(store), tracking=store, metrics=GOOD)
    promote(NAME, 1)
    port, log, envs = free_port(), tmp_path / "serve.log", tmp_path / "envs"
    empty = tmp_path / "empty"
    empty.mkdir()
    argv = [MLFLOW, "models", "serve", "-m", f"models:/{NAME}@champion"]
    argv += ["-h", "127.0.0.1", "-p", str(port), "-w", "1"]
    env = {
        "HOME": os.environ.get("HOME", str(tmp_path)),
        "PATH": f"{bindir}{os.pathsep}/usr/local/bin:/usr/bin:/bin",
        "MLFLOW_TRACKING_URI": os.environ["MLFLOW_TRACKING_URI"],
        "MLFLOW_ENV_ROOT": str(envs),  # its environments here, not under ~/.mlflow
        "VFM_MODEL_CACHE": os.environ["VFM_MODEL_CACHE"],
        "HF_HUB_OFFLINE": "1",
        "OMP_NUM_THREADS": "1",
    }
    net = ("SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY")
    for key, value in os.environ.items():  # where and how this machine's pip gets packages
        if key.startswith("PIP_") or key.upper() in net:
            env[key] = value
    proc = start(argv, log, env, cwd=empty)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(f"{url}/ping", proc, log, timeout=900)
        status, answer = post(
            f"{url}/invocations", {"dataframe_records": [{"prompt": "a red disc", **SMALL}]}
        )
        bad = post(f"{url}/invocations", BAD_REQUESTS[0][0])
    finally:
        stop(proc)
    text = log.read_text()
    assert "Creating a new environment in " + str(envs) in text, text[-3000:]
    made = next(envs.iterdir())
    assert not list(made.glob("lib/python*/site-packages/__editable__*vfm*")), "vfm installed"
    assert status == 200, answer
    row = answer["predictions"][0]
    assert (row["frames"], row["height"], row["width"]) == (5, 32, 32) and row["mp4_base64"]
    assert bad[0] == 400 and bad[1]["message"].endswith(f"\nError: {BAD_REQUESTS[0][1]}"), bad


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
