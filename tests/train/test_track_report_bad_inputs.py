"""Bad inputs of ``vfm track backfill`` and ``vfm report``: each is one ``vfm <cmd>: error:`` line
(exit 2, no traceback) naming the input, or a warning line; nothing silently dropped, and no
MLflow store created at a mistyped path. One sqlite store for the module; runs made with
``MlflowClient`` (no training)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from vfm_core.cli import main
from vfm_core.tracking_backlog import BACKLOG_FILE

METRICS = b'{"step": 1, "loss": 1.0}\n{"step": 2, "loss": 0.5}\n'


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> SimpleNamespace:
    import mlflow

    root = tmp_path_factory.mktemp("store")
    uri = f"sqlite:///{root / 'mlflow.db'}"
    client = mlflow.MlflowClient(uri)
    exp = client.create_experiment("t", artifact_location=(root / "artifacts").as_uri())
    return SimpleNamespace(uri=uri, client=client, exp=exp, root=root)


@pytest.fixture(autouse=True)
def _cwd(tmp_path, monkeypatch):
    """Each test in its own cwd and data dir, no store from the environment."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setenv("VFM_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("VFM_NO_SERVICES", "1")


def _error(capsys, cmd: str) -> str:
    """The one error line of a command that exited 2."""
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert "Traceback" not in err and len(lines) == 1, err
    assert lines[0].startswith(f"vfm {cmd}: error: "), err
    return lines[0]


def _run_dir(tmp_path: Path, store, *, uri: str | None = None, metrics: bytes = METRICS) -> Path:
    """A training run's directory whose MLflow run is in ``store`` (``uri``: its config's
    tracking URI, the store's by default)."""
    run_id = store.client.create_run(store.exp).info.run_id
    d = tmp_path / "run"
    d.mkdir()
    (d / "summary.json").write_text(json.dumps({"step": 2, "mlflow_run_id": run_id}))
    tracking = store.uri if uri is None else uri
    (d / "config.yaml").write_text(f"tracking:\n  tracking_uri: '{tracking}'\n")
    (d / "metrics.jsonl").write_bytes(metrics)
    return d


def _backfill(d: Path, *flags: str) -> int:
    return main(["track", "backfill", str(d), *flags])


# -- vfm track backfill: the store -------------------------------------------------------------


def test_backfill_uses_the_runs_own_store(tmp_path, store, capsys):
    d = _run_dir(tmp_path, store)
    assert _backfill(d, "--json") == 0
    done = json.loads(capsys.readouterr().out)
    assert done["tracking_uri"] == store.uri and done["metrics"] == 2
    assert not (tmp_path / "data").exists()  # no default store made beside it


def test_backfill_refuses_a_missing_store_and_creates_none(tmp_path, store, capsys):
    d = _run_dir(tmp_path, store)
    other = tmp_path / "other.db"
    assert _backfill(d, "--tracking-uri", f"sqlite:///{other}") == 2
    line = _error(capsys, "track")
    assert str(other) in line and "--tracking-uri" in line
    assert not other.exists()


def test_backfill_refuses_an_empty_tracking_uri(tmp_path, store, capsys):
    assert _backfill(_run_dir(tmp_path, store), "--tracking-uri", "") == 2
    assert "--tracking-uri is empty" in _error(capsys, "track")


def test_backfill_without_a_configured_store_refuses_a_missing_default(tmp_path, store, capsys):
    d = _run_dir(tmp_path, store, uri="")
    assert _backfill(d) == 2
    assert "no database at" in _error(capsys, "track")
    assert not (tmp_path / "data").exists()


def test_backfill_names_a_run_the_store_lacks(tmp_path, store, capsys):
    d = _run_dir(tmp_path, store)
    (d / "summary.json").write_text(json.dumps({"mlflow_run_id": "f" * 32}))
    assert _backfill(d) == 2
    line = _error(capsys, "track")
    assert "f" * 32 in line and store.uri in line


# -- vfm track backfill: damaged run-directory files -------------------------------------------

GOOD = b'{"step": 1, "loss": 1.0}\n'
BAD_FILES = [
    ("summary.json", b"[1]", "not an object"),
    ("summary.json", b"\xff\xfe{}", "not UTF-8"),
    ("summary.json", None, "cannot be read"),  # None: a directory of that name
    ("summary.json", b'{"mlflow_run_id": 5}', "mlflow_run_id is 5"),
    ("metrics.jsonl", b'{"loss2": 1}\n' + GOOD, "line 1 has step None"),
    ("metrics.jsonl", b"[1, 2]\n" + GOOD, "line 1 is a JSON list"),
    ("metrics.jsonl", b'{"step": "x", "loss3": 1}\n', "line 1 has step 'x'"),
    ("metrics.jsonl", b'{"step": 1, "loss": "low"}\n', "line 1 has loss = 'low'"),
    ("metrics.jsonl", b"\xff\xfe\n" + GOOD, "line 1 is not UTF-8"),
    ("metrics.jsonl", b"{torn\n" + GOOD, "line 1 is not JSON"),
    ("config.yaml", b"tracking: [1", "cannot be read as YAML"),
    ("config.yaml", b"- 1\n", "not a run config"),
    (BACKLOG_FILE, b"[]", "not an object"),
    (BACKLOG_FILE, b"{}", "no run_id"),
    (BACKLOG_FILE, b'{"run_id": "R", "status": "BOGUS"}', "status is 'BOGUS'"),
    (BACKLOG_FILE, b'{"run_id": "R", "tags": [1]}', "tags is [1]"),
    (BACKLOG_FILE, b'{"run_id": "R", "artifacts": "a.txt"}', "artifacts is 'a.txt'"),
]


@pytest.mark.parametrize(("name", "content", "problem"), BAD_FILES)
def test_backfill_names_a_damaged_file(tmp_path, store, capsys, name, content, problem):
    d = _run_dir(tmp_path, store)
    run_id = json.loads((d / "summary.json").read_text())["mlflow_run_id"]
    path = d / name
    path.unlink(missing_ok=True)
    if content is None:
        path.mkdir()
    else:
        path.write_bytes(content.replace(b'"R"', json.dumps(run_id).encode()))
    assert _backfill(d) == 2
    line = _error(capsys, "track")
    assert str(path) in line and problem in line, line


def test_backfill_leaves_out_a_torn_last_line_with_a_warning(tmp_path, store, capsys):
    d = _run_dir(tmp_path, store, metrics=METRICS + b'{"step": 3, "lo')
    assert _backfill(d, "--json") == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["metrics"] == 2
    assert "warning:" in err and "line 3 (the last) is torn" in err


# -- vfm track backfill: artifacts that no longer exist ----------------------------------------


def test_backfill_warns_of_each_missing_artifact_and_keeps_it_in_the_backlog(
    tmp_path, store, capsys
):
    d = _run_dir(tmp_path, store)
    run_id = json.loads((d / "summary.json").read_text())["mlflow_run_id"]
    kept, gone = tmp_path / "kept.txt", tmp_path / "gone.txt"
    kept.write_text("x")
    backlog = {
        "run_id": run_id,
        "tracking_uri": store.uri,
        "status": "FINISHED",
        "tags": {"k": "v"},
        "artifacts": [str(gone), str(kept)],
    }
    (d / BACKLOG_FILE).write_text(json.dumps(backlog))
    assert _backfill(d) == 0
    out, err = capsys.readouterr()
    assert "1 artifacts (1 not found: see the warnings)" in out
    assert f"warning: artifact {gone} of MLflow run {run_id} no longer exists" in err
    left = json.loads((d / BACKLOG_FILE).read_text())
    assert left["artifacts"] == [str(gone)] and left["tags"] == {}
    run = store.client.get_run(run_id)
    assert run.info.status == "FINISHED" and run.data.tags["k"] == "v"
    assert [a.path for a in store.client.list_artifacts(run_id)] == ["kept.txt"]


# -- vfm report --------------------------------------------------------------------------------


def _study_run(store, study: str, **params: str) -> str:
    """A finished run of ``study`` with a throughput history and ``params``."""
    from mlflow.entities import Metric

    c = store.client
    run_id = c.create_run(store.exp, tags={"vfm.study": study}).info.run_id
    for k, v in {"world_size": "1", **params}.items():
        c.log_param(run_id, k, v)
    metrics = [Metric(k, 100.0, 0, s) for s in (1, 2, 3) for k in ("tokens_per_s", "tflops")]
    c.log_batch(run_id, metrics=[*metrics, Metric("mfu", 0.1, 0, 1)])
    c.set_terminated(run_id)
    return run_id


def _report(store, study: str, *flags: str) -> int:
    return main(["report", "--study", study, "--tracking-uri", store.uri, *flags])


def test_report_matches_a_study_name_with_a_quote(store, capsys):
    _study_run(store, "a'b", world_size="1")
    assert _report(store, "a'b", "--json") == 0
    assert len(json.loads(capsys.readouterr().out)) == 1


def test_report_refuses_a_study_name_with_both_quotes(store, capsys):
    assert _report(store, "a'\"b") == 2
    assert "both quote characters" in _error(capsys, "report")


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("world_size", "abc"),
        ("world_size", "0"),
        ("parallel.tp", "x"),
        ("parallel.dp_shard", "0"),
        ("model.patch", "[1,2"),
        ("model.patch", "[0, 2, 2]"),
        ("model.hidden", "abc"),
        ("model.qk_norm", "yes"),
        ("peak_flops", "zz"),
        ("data.batch_size", "-1"),
    ],
)
def test_report_leaves_out_a_run_with_an_unreadable_param(store, capsys, key, value):
    study = f"bad-{key}-{value}"
    good = _study_run(store, study)
    params = {"data.latent_frames": "1", "data.latent_height": "2", "data.latent_width": "2"}
    bad = _study_run(
        store, study, **({**params, key: value} if key == "model.patch" else {key: value})
    )
    assert _report(store, study, "--json") == 0
    out, err = capsys.readouterr()
    assert [r["run_id"] for r in json.loads(out)] == [good]
    assert f"warning: MLflow run {bad} (study {study!r}): param {key}={value!r}" in err
    assert "left out of the report" in err and "Traceback" not in err


def test_report_warns_of_a_run_without_throughput_but_not_of_the_study_run(store, capsys):
    good = _study_run(store, "quiet")
    c = store.client
    bare = c.create_run(store.exp, tags={"vfm.study": "quiet"}).info.run_id
    parent = c.create_run(store.exp, tags={"vfm.study": "quiet", "vfm.stage": "scaling-study"})
    for run_id in (bare, parent.info.run_id):
        c.set_terminated(run_id)
    assert _report(store, "quiet", "--json") == 0
    out, err = capsys.readouterr()
    assert [r["run_id"] for r in json.loads(out)] == [good]
    assert f"MLflow run {bare} (study 'quiet'): logged no tokens_per_s" in err
    assert parent.info.run_id not in err


def test_report_with_every_run_left_out_is_one_error_line(store, capsys):
    run_id = _study_run(store, "all-bad", world_size="0")
    assert _report(store, "all-bad") == 2
    err = capsys.readouterr().err
    warning, error = err.strip().splitlines()
    assert run_id in warning and error.startswith("vfm report: error: ")
    assert "1 left out: see the warnings" in error


@pytest.mark.parametrize("out", ["t.sh", "t.sh/sub", "s3://bucket/rep", ""])
def test_report_refuses_an_out_that_is_not_a_local_folder(tmp_path, store, capsys, out):
    if out.startswith("t.sh"):
        (tmp_path / "t.sh").write_text("#!/bin/sh\n")
    assert _report(store, "any", "--out", out) == 2
    assert "--out" in _error(capsys, "report")
    assert not (tmp_path / "s3:").exists()


@pytest.mark.parametrize("kind", ["file", "missing", "empty"])
def test_report_refuses_a_tracking_uri_that_is_no_store(tmp_path, capsys, kind):
    path = tmp_path / ("t.sh" if kind == "file" else "newstore")
    if kind == "file":
        path.write_text("#!/bin/sh\n")
    uri = "" if kind == "empty" else str(path)
    assert main(["report", "--study", "any", "--tracking-uri", uri]) == 2
    line = _error(capsys, "report")
    assert "--tracking-uri" in line
    assert kind == "file" or not path.exists()


def test_report_without_a_store_names_the_missing_default_and_creates_none(tmp_path, capsys):
    assert main(["report", "--study", "s"]) == 2
    line = _error(capsys, "report")
    assert "the default store under VFM_DATA_DIR" in line and "does not exist yet" in line
    assert not (tmp_path / "data").exists()
