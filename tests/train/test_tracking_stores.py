"""MLflow tracking URIs as users set them: the classic file store (``file:./mlruns``, a plain
path) works with a one-line note; a server that does not answer and an unknown scheme are one
line naming the URI and the fix, before any work."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest

from vfm_core.cli import main as vfm_main
from vfm_core.tracking import FILE_STORE_OPT_IN, TrackingStoreError, open_store

PACKED = [  # dit-tiny on the mixed shards, whose captions of 9-11 words are cut to 8 tokens
    "model.hidden=64",
    "model.depth=2",
    "model.text_dim=16",
    "train.device=cpu",
    "data.batch_size=2",
    "data.max_tokens=32",
    "data.source=shards",
    "train.log_every=1",
    "tracking.experiment=file-store",
]
TINY = ["model.hidden=64", "model.depth=2", "data.batch_size=2", "train.device=cpu"]


def _sets(overrides: list[str]) -> list[str]:
    return [a for s in overrides for a in ("--set", s)]


@pytest.mark.slow
def test_vfm_train_logs_to_a_file_store(tmp_path, mixed_shards, monkeypatch):
    import mlflow

    shards = mixed_shards.write(tmp_path / "shards")
    env = {k: v for k, v in os.environ.items() if k != FILE_STORE_OPT_IN}
    env.update(MLFLOW_TRACKING_URI="file:./mlruns", OMP_NUM_THREADS="1")
    args = ["train", "--steps", "4", "--out", "run", *_sets([*PACKED, f"data.shards={shards}"])]
    r = subprocess.run(
        [sys.executable, "-m", "vfm_core.cli", *args],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert f"set {FILE_STORE_OPT_IN}=true" in r.stderr  # the one-line note
    assert f"{FILE_STORE_OPT_IN}=true " in r.stdout  # how to open the store in the UI
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").open()]
    assert rows[-1]["captions_cut"] > 0
    monkeypatch.setenv(FILE_STORE_OPT_IN, "true")
    client = mlflow.MlflowClient((tmp_path / "mlruns").as_uri())
    (run,) = client.search_runs([client.get_experiment_by_name("file-store").experiment_id])
    assert run.info.status == "FINISHED"
    assert run.data.metrics["captions_cut"] == rows[-1]["captions_cut"]
    assert run.data.metrics["loss"] == rows[-1]["loss"]


def test_a_plain_path_is_the_file_store_opted_into(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv(FILE_STORE_OPT_IN, raising=False)
    open_store(str(tmp_path / "plain"))
    assert os.environ[FILE_STORE_OPT_IN] == "true"
    assert capsys.readouterr().err.count("\n") == 1  # one note line
    monkeypatch.setenv(FILE_STORE_OPT_IN, "false")  # the user's own "no": one line saying so
    with pytest.raises(
        TrackingStoreError, match=f"refuses the file store; set {FILE_STORE_OPT_IN}"
    ):
        open_store(str(tmp_path / "other"))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("kind", ["unreachable", "unknown scheme"])
def test_a_store_it_cannot_use_is_one_line_before_any_work(kind, tmp_path, monkeypatch, capsys):
    uri = f"http://127.0.0.1:{_free_port()}" if kind == "unreachable" else "foo://bar/mlruns"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")  # in case MLflow asks it anyway
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "5")
    out = tmp_path / "run"
    assert vfm_main(["train", "--steps", "1", "--out", str(out), *_sets(TINY)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and uri in err, err
    want = "no server answers" if kind == "unreachable" else "no store for the scheme 'foo'"
    assert want in err and "unset it for the sqlite store" in err
    assert not (out / "metrics.jsonl").exists()


def test_a_store_the_flag_names_is_refused_naming_the_flag(tmp_path, monkeypatch, capsys):
    """vfm report --tracking-uri URI: the one line names the flag as where URI was set (not the
    environment variable, which is set to a good store here)."""
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'ok.db'}")
    uri = f"http://127.0.0.1:{_free_port()}"
    assert vfm_main(["report", "--study", "s", "--tracking-uri", uri]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{uri} (--tracking-uri): no server answers" in err, err
    assert "MLFLOW_TRACKING_URI" not in err


def test_a_sqlite_file_that_is_not_a_database_is_one_line(tmp_path, capsys):
    """vfm report (and vfm train, vfm generate --checkpoint models:/...) on sqlite:///FILE where
    FILE is no database: one line naming the URI and the flag, not sqlalchemy's traceback."""
    (tmp_path / "notes.txt").write_text("hi\n")
    uri = f"sqlite:///{tmp_path / 'notes.txt'}"
    assert vfm_main(["report", "--study", "s", "--tracking-uri", uri]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert f"{uri} (--tracking-uri): its database cannot be used (file is not a database)" in err


def test_report_never_creates_a_store_at_a_mistyped_path(tmp_path, capsys):
    db = tmp_path / "typo" / "dir" / "x.db"
    assert vfm_main(["report", "--study", "s", "--tracking-uri", f"sqlite:///{db}"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"(--tracking-uri): no database at {db} " in err, err
    assert not (tmp_path / "typo").exists()


def test_an_empty_experiment_name_names_the_setting(tmp_path):
    from vfm_core.config import ConfigError, TrackingConfig
    from vfm_core.tracking import ensure_experiment

    cfg = TrackingConfig(experiment="", tracking_uri=f"sqlite:///{tmp_path / 'm.db'}")
    with pytest.raises(ConfigError, match=r"^tracking.experiment: '' is empty; name the MLflow"):
        ensure_experiment(cfg)


def test_ui_hints_name_a_port_nothing_holds():
    import socket

    from vfm_core.tracking import free_local_port

    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        assert free_local_port(port) != port  # taken (make up's server): the next free one
    assert free_local_port(port) == port  # free again
