"""Bad input and faults around a training run (issue #27), one process: the checkpoint a run
reports is the one it wrote; a torn last metrics line; range-checked settings; ``--out`` a file,
read-only or under a read-only parent; a disk that fills up during a save; a resume whose MLflow
run is not in the current tracking store. Each is one line naming the input, or a run that goes
on with one warning line.

One trained run (checkpoints at steps 2, 4, 6) is shared by the cases that resume, copied per case.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import json
import os
import re
import shutil
from pathlib import Path

import pytest
from torch.distributed.checkpoint import filesystem as dcp_filesystem

from tests.tiny_runs import TINY_CPU
from vfm_core.checkpoints import manager as checkpoint_mod
from vfm_core.checkpoints.manager import CheckpointError, CheckpointManager
from vfm_core.cli import main as vfm_main
from vfm_core.config import ConfigError, apply_overrides, save_yaml
from vfm_core.recipes import get_recipe
from vfm_core.tracking import CHECKPOINT_TAG, PREVIOUS_RUN_TAG
from vfm_core.train import main as main_mod
from vfm_core.train import metrics as metrics_mod
from vfm_core.train.main import OutDirError, run_training
from vfm_core.train.main import main as train_main
from vfm_core.train.metrics import JsonlLogger, MetricsFileError

TINY = [
    *TINY_CPU,
    "optim.lr=2e-3",
    "optim.warmup_steps=2",
    "tracking.mlflow=false",
    "train.steps=6",
    "train.ckpt_every=2",
    "train.keep_ckpts=3",
]
CLI_TINY = [a for s in TINY if not s.startswith("train.steps=") for a in ("--set", s)]


def _cfg(*extra: str):
    return apply_overrides(get_recipe("dit-tiny"), [*TINY, *extra])


def _losses(out: Path) -> list[tuple[int, float]]:
    rows = map(json.loads, (out / "metrics.jsonl").read_text().splitlines())
    return [(r["step"], r["loss"]) for r in rows]


def _truncate_shard(ck: Path) -> None:
    (f,) = ck.glob("*.safetensors")
    os.truncate(f, f.stat().st_size // 2)


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("bad-inputs") / "run"
    run_training(_cfg(), out_dir=out, progress=False)
    return out


@pytest.fixture
def run(trained, tmp_path) -> Path:
    """A fresh copy of the trained run."""
    return Path(shutil.copytree(trained, tmp_path / "run"))


# --------------------------------------------------------------- 1: the checkpoint a run reports
def test_a_resumed_run_reports_the_checkpoint_it_wrote_not_a_newer_damaged_one(run, capsys):
    ckpts = run / "checkpoints"
    _truncate_shard(ckpts / "step_00000006")  # a newer checkpoint of an earlier attempt, damaged
    cfg = _cfg("train.steps=4", "train.keep_ckpts=1")
    summary = run_training(cfg, out_dir=run, resume_from=ckpts / "step_00000002", progress=False)
    assert summary["checkpoint"] == str(ckpts / "step_00000004")
    assert json.loads((run / "summary.json").read_text())["checkpoint"] == str(
        ckpts / "step_00000004"
    )
    capsys.readouterr()
    assert CheckpointManager(run).choose() == ckpts / "step_00000004"  # what --resume would pick
    assert "warning: skipping checkpoint" in capsys.readouterr().err

    # a run that had nothing left to train reports the checkpoint it resumed from
    summary = run_training(cfg, out_dir=run, resume_from=ckpts / "step_00000004", progress=False)
    assert summary["checkpoint"] == str(ckpts / "step_00000004")


def test_a_resume_with_another_seed_says_the_draws_change(run, capsys):
    """``--resume --seed N`` with another seed than the run's changes every later step's noise
    and caption dropout; it trained on silently, now one warning line says so."""
    capsys.readouterr()
    cfg = _cfg("train.steps=5", "train.seed=5")
    at = run / "checkpoints" / "step_00000004"
    run_training(cfg, out_dir=run, resume_from=at, progress=False)
    warnings = [ln for ln in capsys.readouterr().err.splitlines() if "train.seed" in ln]
    assert warnings == [
        "warning: resume: train.seed: 0 in the checkpoint, 5 now: the step's random draws "
        "(noise, caption dropout) from step 5 differ from the ones the run would have drawn"
    ]


# --------------------------------------------------------------- 2: a torn last metrics line
def test_resume_drops_a_torn_last_metrics_line_with_one_warning(run, trained, capsys, monkeypatch):
    shutil.rmtree(run / "checkpoints" / "step_00000006")  # killed while logging step 6
    metrics = run / "metrics.jsonl"
    text = metrics.read_text()
    torn = text[: len(text) - 40]
    metrics.write_text(torn)  # the last line cut short, no newline
    replaced = []
    real_replace = os.replace
    monkeypatch.setattr(
        metrics_mod.os, "replace", lambda a, b: (replaced.append((a, b)), real_replace(a, b))
    )
    capsys.readouterr()
    run_training(_cfg(), out_dir=run, resume=True, progress=False)
    warnings = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("warning:")]
    assert warnings == [
        f"warning: {metrics}: dropped its torn last line (line 6, {len(torn.splitlines()[-1])} "
        "characters, not a complete record: the run was stopped while writing it)"
    ]
    tmp = metrics.with_name("metrics.jsonl.tmp")
    assert [(a, b) for a, b in replaced if b == metrics] == [(tmp, metrics)]  # atomic rewrite
    assert _losses(run) == _losses(trained)  # steps 1..6 once each, 5 and 6 retrained
    assert not tmp.exists()


def test_a_damaged_metrics_line_before_the_last_is_one_clear_error(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1, "loss": 1.0}\n{"step": 2, "lo\n{"step": 3, "loss": 0.5}\n')
    with pytest.raises(MetricsFileError, match=rf"^{path}: line 2 is not a metrics record"):
        JsonlLogger(path, resume_step=3)
    assert path.read_text().count("\n") == 3  # untouched


# --------------------------------------------------------------- 11, 12: numbers and ranges
def test_out_of_range_settings_stop_a_run_before_any_work(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(main_mod, "init_world", lambda *a: pytest.fail("work started"))
    with pytest.raises(ConfigError, match=r"^optim.lr: must be > 0, got -1.0$"):
        run_training(_cfg("optim.lr=-1"), out_dir=tmp_path / "a", progress=False)
    rc = vfm_main(["train", "--steps", "1", "--out", str(tmp_path / "b"), "--set", "optim.lr=-1"])
    assert rc == 2
    assert capsys.readouterr().err == "vfm train: error: optim.lr: must be > 0, got -1.0\n"
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


# --------------------------------------------------------------- 13, 22, 23: the output directory
def test_out_that_is_a_file_is_one_line_naming_out(tmp_path, capsys):
    path = tmp_path / "notes.txt"
    path.write_text("mine")
    wanted = f"--out {path}: is a file, not a directory (choose another --out)"
    for resume in ([], ["--resume"]):
        assert vfm_main(["train", "--steps", "1", "--out", str(path), *resume, *CLI_TINY]) == 2
        assert capsys.readouterr().err == f"vfm train: error: {wanted}\n"
    config = tmp_path / "run.yaml"
    save_yaml(_cfg(), config)
    assert train_main(["--config", str(config), "--out", str(path)]) == 2
    assert capsys.readouterr().err == f"error: {wanted}\n"
    assert path.read_text() == "mine"


@contextlib.contextmanager
def _read_only(*folders: Path):
    """``folders`` mode 0o555, as for any user: root ignores file modes (CAP_DAC_OVERRIDE), so
    as root that capability leaves this thread's effective set for the block (capset(2))."""
    modes = [f.stat().st_mode for f in folders]
    for f in folders:
        f.chmod(0o555)
    libc = ctypes.CDLL(None, use_errno=True)
    header = (ctypes.c_uint32 * 2)(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3, this thread
    caps = (ctypes.c_uint32 * 6)()  # (effective, permitted, inheritable) x 2 words
    saved = None
    try:
        if os.geteuid() == 0:
            if libc.capget(header, caps) != 0:
                pytest.skip("running as root and capget(2) failed")
            saved = list(caps)
            caps[0] &= ~(1 << 1)  # CAP_DAC_OVERRIDE
            if libc.capset(header, caps) != 0:
                pytest.skip("running as root and cannot drop CAP_DAC_OVERRIDE")
        yield
    finally:
        if saved is not None:
            caps[:] = saved
            libc.capset(header, caps)
        for f, mode in zip(folders, modes):
            f.chmod(mode)


def test_read_only_out_is_one_line_before_any_work(run, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(main_mod, "init_world", lambda *a: pytest.fail("work started"))
    with _read_only(run, run / "checkpoints"):
        with pytest.raises(OutDirError) as e:
            run_training(_cfg("train.steps=8"), out_dir=run, resume=True, progress=False)
    assert str(e.value) == (
        f"--out {run}: not writable, cannot create a file in {run} (Permission denied)"
    )
    with _read_only(run / "checkpoints"):
        with pytest.raises(OutDirError, match=r"cannot create a file in .*/run/checkpoints \("):
            run_training(_cfg("train.steps=8"), out_dir=run, resume=True, progress=False)

    parent = tmp_path / "ro"
    parent.mkdir()
    new = parent / "new"
    with _read_only(parent):
        rc = vfm_main(["train", "--steps", "1", "--out", str(new), *CLI_TINY])
    assert rc == 2
    assert capsys.readouterr().err == (
        f"vfm train: error: --out {new}: cannot create the directory (Permission denied)\n"
    )
    assert list(parent.iterdir()) == [] and not list(run.rglob(".write-probe*"))


# --------------------------------------------------------------- 25: disk full during a save
def _disk_fills_up_in(folder: str, room: int, monkeypatch) -> None:
    """Writes of DCP's file-system writer into ``folder`` stop with ENOSPC after ``room`` bytes,
    the ones before written (a disk that fills up during a save)."""
    real = dcp_filesystem.FileSystem.create_stream

    class Full:
        def __init__(self, stream):
            self._stream, self._left = stream, room

        def write(self, data) -> int:
            if len(data) > self._left:
                self._stream.write(bytes(data[: self._left]))
                self._stream.flush()
                self._left = 0
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            self._left -= len(data)
            return self._stream.write(data)

        def __getattr__(self, name):
            return getattr(self._stream, name)

    @contextlib.contextmanager
    def create_stream(self, path, mode):
        with real(self, path, mode) as stream:
            yield Full(stream) if folder in str(path) else stream

    monkeypatch.setattr(dcp_filesystem.FileSystem, "create_stream", create_stream)


@pytest.mark.parametrize("where", ["tensors", "tensors-async", "manifest"])
def test_disk_full_during_a_save_removes_it_and_says_how_much(where, tmp_path, monkeypatch):
    out = tmp_path / "run"
    if where == "manifest":  # the tensors fit, the manifest does not
        real = checkpoint_mod.write_manifest

        def write_manifest(folder, **kw):
            if folder.name == "step_00000002.tmp":
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            return real(folder, **kw)

        monkeypatch.setattr(checkpoint_mod, "write_manifest", write_manifest)
    else:
        _disk_fills_up_in("step_00000002.tmp", 100_000, monkeypatch)
    asyn = "train.async_checkpoint=" + str(where.endswith("async")).lower()
    cfg = _cfg("train.steps=2", "train.ckpt_every=1", asyn)
    with pytest.raises(CheckpointError) as e:
        run_training(cfg, out_dir=out, progress=False)
    tmp = out / "checkpoints" / "step_00000002.tmp"
    assert re.fullmatch(
        ("asynchronous " if "async" in where else "")
        + rf"checkpoint of step 2: writing {tmp} failed \(No space left on device\): it tried to "
        r"write [\d,]{9,} bytes \(\d+\.\d MiB\) of tensors, [\d,]+ bytes( \(\d+\.\d [KMGT]iB\))? "
        rf"free there after removing it; the previous checkpoints under {out / 'checkpoints'} "
        "are intact",
        str(e.value),
    ), str(e.value)
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step_00000001"]
    assert CheckpointManager(out).choose() == out / "checkpoints" / "step_00000001"


# --------------------------------------------------------------- 26: the MLflow run is gone
def test_resume_whose_mlflow_run_is_not_in_the_store_goes_on_in_a_new_run(
    tmp_path, capsys, monkeypatch
):
    import mlflow

    # mlflow.set_tracking_uri exports $MLFLOW_TRACKING_URI, which tracking_uri() follows: each
    # run_training here stands for a new process, with the environment the session started with
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)

    out = tmp_path / "run"
    server = f"sqlite:///{tmp_path / 'server' / 'mlflow.db'}"  # the store of a server now gone
    (tmp_path / "server").mkdir()
    on = ["tracking.mlflow=true", "tracking.experiment=bad-inputs", "train.steps=2"]
    first = run_training(_cfg(*on, f"tracking.tracking_uri={server}"), out_dir=out, progress=False)
    old = first["mlflow_run_id"]
    os.environ.pop("MLFLOW_TRACKING_URI", None)  # the server is gone: the default store now
    capsys.readouterr()

    second = run_training(_cfg(*on, "train.steps=4"), out_dir=out, resume=True, progress=False)
    new = second["mlflow_run_id"]
    warnings = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("warning:")]
    assert new and new != old
    assert len(warnings) == 1 and warnings[0].startswith(
        f"warning: MLflow run {old} of the checkpoint is not in (or deleted from) the tracking "
        "store "
    )
    assert warnings[0].endswith(f"logging to run {new} instead, tagged {PREVIOUS_RUN_TAG}={old}")
    run = mlflow.MlflowClient().get_run(new)
    assert run.info.status == "FINISHED" and run.data.tags[PREVIOUS_RUN_TAG] == old
    step4 = out / "checkpoints" / "step_00000004"
    assert run.data.tags[CHECKPOINT_TAG] == step4.resolve().as_uri()
    assert CheckpointManager.read_meta(step4)["meta"]["mlflow_run_id"] == new

    # the run of the checkpoint is reachable now: it goes on there, no warning
    os.environ.pop("MLFLOW_TRACKING_URI", None)
    third = run_training(_cfg(*on, "train.steps=6"), out_dir=out, resume=True, progress=False)
    assert third["mlflow_run_id"] == new
    assert "warning" not in capsys.readouterr().err
