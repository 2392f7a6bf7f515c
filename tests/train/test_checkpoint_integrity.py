"""Trustworthy checkpoints (issue #17), one process: every checkpoint carries a manifest (size +
sha256 of each file, written last); ``--resume`` skips a damaged newest checkpoint with one warning
line and continues from the newest intact one with the losses of the run that never stopped
(bit-identical); all damaged is one clear error; ``vfm checkpoint verify`` reports each case;
retention never removes the last good checkpoint; load errors are one line naming the checkpoint
and the file.

One trained run (checkpoints at steps 2, 4, 6) is shared by every case and copied per case.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from tests.tiny_runs import TINY_CPU
from vfm_core.checkpoints import manager as checkpoint_mod
from vfm_core.checkpoints.integrity import MANIFEST_FILE, verify, write_manifest
from vfm_core.checkpoints.manager import CheckpointError, CheckpointManager, load_trainer
from vfm_core.cli import main as vfm_main
from vfm_core.config import apply_overrides
from vfm_core.recipes import get_recipe
from vfm_core.train.main import main as train_main
from vfm_core.train.main import run_training
from vfm_core.train.trainer import Trainer

STEPS = 6
TINY = [
    *TINY_CPU,
    "optim.lr=0.002",
    "optim.warmup_steps=2",
    "tracking.mlflow=false",
    f"train.steps={STEPS}",
    "train.ckpt_every=2",
    "train.keep_ckpts=3",
]


def _cfg(*extra: str):
    return apply_overrides(get_recipe("dit-tiny"), [*TINY, *extra])


def _losses(out: Path) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in map(json.loads, (out / "metrics.jsonl").open())}


def _shard(ckpt: Path) -> Path:
    (f,) = sorted(ckpt.glob("*.safetensors"))
    return f


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("run") / "run"
    run_training(_cfg(), out_dir=out, progress=False)
    assert [p.name for p in CheckpointManager(out).list()] == [
        "step_00000002",
        "step_00000004",
        "step_00000006",
    ]
    return out


@pytest.fixture
def run(trained, tmp_path) -> Path:
    """A fresh copy of the trained run."""
    return Path(shutil.copytree(trained, tmp_path / "run"))


def _truncate(ck: Path) -> str:
    f = _shard(ck)
    size = f.stat().st_size
    with open(f, "r+b") as fh:
        fh.truncate(size // 2)
    return f"{f.name}: {size // 2} bytes, the manifest says {size} (truncated)"


def _flip(ck: Path) -> str:
    f = _shard(ck)
    raw = bytearray(f.read_bytes())
    for i in range(len(raw) // 2, len(raw) // 2 + 16):
        raw[i] ^= 0xFF
    f.write_bytes(bytes(raw))
    return f"{f.name}: sha256 differs from the manifest"


def _delete(ck: Path) -> str:
    f = _shard(ck)
    f.unlink()
    return f"{f.name}: missing"


def _bad_state_json(ck: Path) -> str:
    p = ck / "state.json"
    p.write_text(p.read_text()[:-40] + "garbage")
    return "state.json: "


def _bad_manifest(ck: Path) -> str:
    (ck / MANIFEST_FILE).write_text('{"format": "vfm-checkpoint-manifest", "files": {')
    return f"{MANIFEST_FILE}: not valid JSON"


def _no_manifest(ck: Path) -> str:
    (ck / MANIFEST_FILE).unlink()
    return f"{MANIFEST_FILE}: missing (the save did not finish"


def _garbage_sealed(ck: Path) -> str:
    """Garbage in place of the tensors, the manifest hashed again to match it."""
    f = _shard(ck)
    f.write_bytes(b"\xff" * 5000)
    write_manifest(ck, step=int(ck.name.removeprefix("step_")))
    return f"{f.name}: not a readable safetensors file (Error while deserializing header"


DAMAGE = {
    "truncate": _truncate,
    "flip": _flip,
    "delete": _delete,
    "state_json": _bad_state_json,
    "manifest_json": _bad_manifest,
    "no_manifest": _no_manifest,
    "garbage_sealed": _garbage_sealed,
}


def test_every_checkpoint_has_a_complete_manifest(trained):
    for ck in CheckpointManager(trained).list():
        doc = json.loads((ck / MANIFEST_FILE).read_text())
        names = sorted(p.name for p in ck.iterdir() if p.name != MANIFEST_FILE)
        assert sorted(doc["files"]) == names and "state.json" in names
        assert all(doc["files"][n]["bytes"] == (ck / n).stat().st_size for n in names)
        assert verify(ck) == []


@pytest.mark.parametrize("damage", DAMAGE)
def test_resume_skips_a_damaged_newest_checkpoint_with_the_same_losses(
    run, damage, capsys, trained
):
    newest = run / "checkpoints" / "step_00000006"
    expected = DAMAGE[damage](newest)
    capsys.readouterr()

    # vfm checkpoint verify: one line per checkpoint, exit 1
    assert vfm_main(["checkpoint", "verify", str(run)]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"ok   {run / 'checkpoints' / 'step_00000002'}"
    assert lines[1] == f"ok   {run / 'checkpoints' / 'step_00000004'}"
    assert lines[2].startswith(f"BAD  {newest}: ") and expected in lines[2], lines[2]
    assert lines[3] == "2 of 3 checkpoint(s) intact"

    # --resume falls back to step 4 with one warning line, then the same losses as never stopping
    summary = run_training(_cfg(), out_dir=run, resume=True, progress=False)
    err = capsys.readouterr().err
    warnings = [x for x in err.splitlines() if x.startswith("warning:")]
    assert len(warnings) == 1 and warnings[0].startswith(f"warning: skipping checkpoint {newest}")
    assert expected in warnings[0]
    assert f"resumed from {run / 'checkpoints' / 'step_00000004'} at step 4" in err
    assert summary["step"] == STEPS
    assert _losses(run) == _losses(trained)  # exact, every step (5, 6 retrained)
    assert all(verify(ck) == [] for ck in CheckpointManager(run).candidates())  # 6 rewritten


def test_all_checkpoints_damaged_is_one_clear_error(run, capsys):
    for ck, damage in zip(CheckpointManager(run).candidates(), (_truncate, _flip, _delete)):
        damage(ck)
    rc = train_main(["--config", str(run / "config.yaml"), "--out", str(run), "--resume"])
    err = capsys.readouterr().err.splitlines()
    assert rc == 2
    assert err[-1] == (
        f"error: --resume: no valid checkpoint under {run / 'checkpoints'} (all 3 "
        "damaged or unfinished, see the warnings above)"
    )
    assert [x.split(":")[0] for x in err[:-1]] == ["warning"] * 3
    assert not any("Traceback" in x for x in err)
    assert vfm_main(["checkpoint", "verify", str(run)]) == 1
    assert capsys.readouterr().out.splitlines()[-1] == "0 of 3 checkpoint(s) intact"


def test_resume_from_picks_a_checkpoint_and_refuses_a_damaged_one(run, trained, capsys):
    two = run / "checkpoints" / "step_00000002"
    run_training(_cfg(), out_dir=run, resume_from=two, progress=False)
    assert f"resumed from {two} at step 2" in capsys.readouterr().err
    assert _losses(run) == _losses(trained)
    _flip(two)
    with pytest.raises(
        CheckpointError,
        match=rf"^--resume-from: checkpoint {two}: shard-.*"
        "sha256 differs",
    ):
        run_training(_cfg(), out_dir=run, resume_from=two, progress=False)
    assert vfm_main(["checkpoint", "verify", str(two)]) == 1


def test_manifest_entries_outside_the_folder_and_unlisted_files_are_problems(run, capsys):
    """A manifest naming ../x, /x or sub/x is malformed (nothing outside the checkpoint is
    read); a tensor or JSON file the manifest does not list is named, not passed as ok (other
    files, never opened, are left alone)."""
    ck = run / "checkpoints" / "step_00000002"
    outside = run / "outside.txt"
    outside.write_text("not part of the checkpoint\n")
    good = (ck / MANIFEST_FILE).read_text()
    for name in ("../../outside.txt", str(outside), "sub/state.json", ".."):
        doc = json.loads(good)
        doc["files"][name] = {"bytes": outside.stat().st_size, "sha256": "0" * 64}
        (ck / MANIFEST_FILE).write_text(json.dumps(doc))
        (problem,) = verify(ck)
        assert str(problem) == (
            f"checkpoint {ck}: {MANIFEST_FILE}: entry {name!r} is not a file name inside the "
            "checkpoint folder"
        )
    (ck / MANIFEST_FILE).write_text(good)
    (ck / "x.pkl").write_bytes(b"\x80\x04K\x01.")  # never opened: not a loader's file
    assert verify(ck) == []
    (ck / "extra.json").write_text("{}")
    capsys.readouterr()
    assert vfm_main(["checkpoint", "verify", str(ck)]) == 1
    assert capsys.readouterr().out.splitlines()[0] == (
        f"BAD  {ck}: extra.json: not listed in the manifest (added after the save)"
    )
    (ck / "extra.json").unlink()
    # a step that is no step, or another than the folder's (a copy named step_9 passed as ok,
    # and resume picks the newest folder by its name)
    for step, why in [("two", "step 'two' is not a step number"), (7, "says step 7, the folder")]:
        (ck / MANIFEST_FILE).write_text(json.dumps({**json.loads(good), "step": step}))
        (problem,) = verify(ck)
        assert why in str(problem)
    (ck / MANIFEST_FILE).write_text(good)
    copy = Path(shutil.copytree(ck, run / "checkpoints" / "step_00000009"))
    (problem,) = verify(copy)
    assert "says step 2, the folder name step 9 (renamed or copied)" in str(problem)


def test_a_sealed_tensor_of_another_shape_is_one_line_naming_the_checkpoint(run):
    """The manifest matches the files, but a tensor has another shape than the model's."""
    from safetensors.torch import load_file, save_file

    ck = run / "checkpoints" / "step_00000002"
    shard = _shard(ck)
    tensors = load_file(shard)
    tensors["ema.x_embedder.weight"] = torch.zeros(3, 3)
    save_file(tensors, shard)
    write_manifest(ck, step=2)
    assert verify(ck) == []  # a well-formed checkpoint, of the wrong tensor
    with pytest.raises(CheckpointError) as e:
        load_trainer(CheckpointManager(run), Trainer(_cfg()), ck)
    assert str(e.value).startswith(
        f"checkpoint {ck}: *.safetensors: cannot load the tensors (Size mismatch between saved "
        "torch.Size([3, 3]) and current"
    )
    assert "ema.x_embedder.weight" in str(e.value) and "\n" not in str(e.value)


def test_retention_never_loses_the_last_good_checkpoint(tmp_path, monkeypatch):
    cfg = _cfg("train.steps=4", "train.keep_ckpts=1")
    tr = Trainer(cfg)
    ckpt = CheckpointManager(tmp_path, keep=1)
    tr.fit(loggers=[], checkpoint=lambda t: checkpoint_mod.save_trainer(ckpt, t))
    assert [p.name for p in ckpt.candidates()] == ["step_00000004"]

    def crash(*a, **k):
        raise KeyboardInterrupt("killed")

    # killed while hashing the new checkpoint: no manifest, the .tmp folder is never listed
    monkeypatch.setattr(checkpoint_mod, "write_manifest", crash)
    tr.step = 6
    with pytest.raises(KeyboardInterrupt):
        checkpoint_mod.save_trainer(ckpt, tr)
    assert [p.name for p in ckpt.list()] == ["step_00000004"]
    assert (ckpt.dir / "step_00000006.tmp").is_dir() and verify(ckpt.latest()) == []
    monkeypatch.undo()

    # killed after the new one verified, before the old one went: both intact
    monkeypatch.setattr(CheckpointManager, "_retire", crash)
    with pytest.raises(KeyboardInterrupt):
        checkpoint_mod.save_trainer(ckpt, tr)
    assert [p.name for p in ckpt.list()] == ["step_00000004", "step_00000006"]
    assert all(verify(p) == [] for p in ckpt.list())
    monkeypatch.undo()

    # the next save retires both older ones and the leftovers
    tr.step = 8
    checkpoint_mod.save_trainer(ckpt, tr)
    assert sorted(p.name for p in ckpt.dir.iterdir()) == ["step_00000008"]


def test_load_errors_name_the_checkpoint_and_the_file(trained):
    ck = trained / "checkpoints" / "step_00000002"

    # optimizer state of another optimizer
    tr = Trainer(_cfg())
    tr.optimizer = torch.optim.SGD(tr.model.parameters(), lr=0.1, momentum=0.9)
    with pytest.raises(
        CheckpointError,
        match=rf"^checkpoint {ck}: state.json: optimizer state of "
        r"another optimizer \(saved \['exp_avg', 'exp_avg_sq', 'step'\], this "
        r"trainer's optimizer holds \['momentum_buffer'\]\)$",
    ):
        load_trainer(CheckpointManager(trained), tr, ck)

    # loader state of another dataset
    with pytest.raises(CheckpointError, match=rf"^checkpoint {ck}: state.json: .*data.seed"):
        load_trainer(CheckpointManager(trained), Trainer(_cfg("data.seed=7")), ck)

    # another model family / shape
    with pytest.raises(
        CheckpointError,
        match=rf"^checkpoint {ck} \(state.json\) was trained "
        r"with another model shape \(model.hidden: checkpoint 64 vs now 32",
    ):
        load_trainer(CheckpointManager(trained), Trainer(_cfg("model.hidden=32")), ck)


def test_debug_shows_the_traceback_behind_the_one_line(run, capsys):
    for ck in CheckpointManager(run).candidates():
        _truncate(ck)
    args = ["--config", str(run / "config.yaml"), "--out", str(run), "--resume"]
    assert train_main([*args, "--debug"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" in err and err.splitlines()[-1].startswith("error: --resume: no valid")


def test_a_save_writes_files_of_bounded_size_and_loads_back(tmp_path, monkeypatch):
    """The writer serialises a whole file in memory: a rank's tensors go into files of at most
    ``FILE_BYTES`` each (a larger tensor alone), and the checkpoint loads back exactly."""
    monkeypatch.setattr(checkpoint_mod, "FILE_BYTES", 64 * 2**10)
    tr = Trainer(_cfg("train.steps=1"))
    tr.fit(loggers=[])
    ckpt = CheckpointManager(tmp_path)
    checkpoint_mod.save_trainer(ckpt, tr)
    files = sorted(ckpt.latest().glob("*.safetensors"))
    biggest = max(p.numel() * p.element_size() for _, p in tr.layout.named_parameters())
    assert len(files) > 3
    assert all(f.stat().st_size <= max(64 * 2**10, biggest) + 2**16 for f in files)
    assert verify(ckpt.latest()) == []
    again = Trainer(_cfg("train.steps=1"))
    load_trainer(ckpt, again, ckpt.latest())
    for (name, p), (_, q) in zip(tr.layout.named_parameters(), again.layout.named_parameters()):
        assert torch.equal(p, q), name
    assert again.step == tr.step
