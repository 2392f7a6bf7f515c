"""Trustworthy checkpoints under FSDP2 (issues #17, #13): 2 ranks save asynchronously (each rank
its own shard file, a separate gloo group for the background writes, the manifest written by rank
0 after every rank's writes); the newest checkpoint truncated, flipped, missing a shard or with
corrupt JSON is skipped on resume by both ranks, which continue from the newest intact one with
the losses of the run that never stopped (bit-identical); ``vfm checkpoint verify`` reports it."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from parallel_harness import build_trainer, fit_collect, run_ranks

from vfm_core.cli import main as vfm_main
from vfm_core.config import apply_overrides
from vfm_core.recipes import get_recipe

FSDP2 = {"dp_shard": 2}
TINY = [
    "model.hidden=64",
    "model.depth=2",
    "model.text_dim=32",
    "data.batch_size=4",
    "data.latent_height=8",
    "data.latent_width=8",
    "train.device=cpu",
    "optim.lr=0.002",
    "optim.warmup_steps=2",
    "tracking.mlflow=false",
    "train.steps=4",
    "train.ckpt_every=2",
]


def _trainer(world):
    return build_trainer(apply_overrides(get_recipe("dit-tiny"), TINY), world, FSDP2)


def _fit_async(rank, world, root):
    from vfm_core.checkpoints.manager import CheckpointManager, save_trainer

    ckpt = CheckpointManager(root, keep=2, async_save=True)
    losses = fit_collect(_trainer(world), checkpoint=lambda t: save_trainer(ckpt, t)).losses
    ckpt.wait()
    ckpt.close()
    return losses


def _resume_each(rank, world, roots):
    from vfm_core.checkpoints.manager import CheckpointManager, load_trainer

    out = []
    for root in roots:
        tr = _trainer(world)
        path = load_trainer(CheckpointManager(root), tr)
        out.append({"path": path.name, "step": tr.step, "losses": fit_collect(tr).losses})
    return out


def _truncate(f: Path) -> None:
    with open(f, "r+b") as fh:
        fh.truncate(f.stat().st_size // 2)


def _flip(f: Path) -> None:
    raw = bytearray(f.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    f.write_bytes(bytes(raw))


def _bad_json(ck: Path) -> None:
    (ck / "state.json").write_text('{"format": 1, "step": ')


@pytest.mark.slow
def test_fsdp2_async_checkpoints_fall_back_past_a_damaged_newest(tmp_path, capsys):
    root = tmp_path / "run"
    expected = run_ranks(_fit_async, 2, str(root))[0]
    ck = root / "checkpoints"
    assert sorted(p.name for p in ck.iterdir()) == ["step_00000002", "step_00000004"]
    shards = sorted(p.name for p in (ck / "step_00000004").glob("*.safetensors"))
    assert len(shards) == 2  # one file per rank

    cases = {
        "truncate": lambda c: _truncate(c / shards[1]),
        "flip": lambda c: _flip(c / shards[0]),
        "delete": lambda c: (c / shards[1]).unlink(),
        "json": _bad_json,
    }
    roots = []
    for name, damage in cases.items():
        copy = Path(shutil.copytree(root, tmp_path / name))
        damage(copy / "checkpoints" / "step_00000004")
        assert vfm_main(["checkpoint", "verify", str(copy)]) == 1
        lines = capsys.readouterr().out.splitlines()
        assert lines[0].startswith("ok ") and lines[1].startswith("BAD "), (name, lines)
        roots.append(str(copy))
    for rank_result in run_ranks(_resume_each, 2, roots):
        for r in rank_result:
            assert r["path"] == "step_00000002" and r["step"] == 2
            assert r["losses"] == expected[2:]  # bit-identical
