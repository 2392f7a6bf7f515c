"""Cheap adaptation, one process: LoRA adapters start as the identity and merge exactly; a run
trains only its adapters (or ``train.trainable``), keeps the base frozen, checkpoints only what
trains with a reference to its base, resumes bit-identically and merges into a plain model
(``vfm checkpoint merge``) that loads like any run; bad targets, ranks and patterns are one line.
The equalities across layouts (TP2, FSDP2, PP2): tests/parallel/test_resharding.py."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from torch import nn

from tests.tiny_runs import TINY_CPU
from vfm_core.checkpoints.errors import CheckpointError
from vfm_core.checkpoints.init import open_init
from vfm_core.checkpoints.load import load_dit
from vfm_core.checkpoints.merge import merge_checkpoint
from vfm_core.cli import main as vfm_main
from vfm_core.config import ConfigError, LoraConfig, apply_overrides
from vfm_core.families import build_model
from vfm_core.models.lora import LoRALinear, add_adapters, freeze, is_adapter
from vfm_core.recipes import get_recipe
from vfm_core.train.main import run_training

TINY = [*TINY_CPU, "tracking.mlflow=false", "optim.lr=0.01", "optim.warmup_steps=1"]


def _cfg(*extra: str):
    return apply_overrides(get_recipe("dit-tiny"), [*TINY, *extra])


def _tensors(ckpt: Path) -> dict[str, torch.Tensor]:
    return {k: v for f in ckpt.glob("*.safetensors") for k, v in load_file(f).items()}


def test_an_adapter_starts_as_its_linear_and_merges_exactly():
    torch.manual_seed(0)
    base = nn.Linear(12, 8)
    lora = LoRALinear(base, rank=3, scale=2.0)
    nn.init.normal_(lora.lora_a)
    nn.init.zeros_(lora.lora_b)
    x = torch.randn(5, 12)
    assert torch.equal(lora(x), base(x))  # B = 0: the base's function
    nn.init.normal_(lora.lora_b)
    want = base(x) + 2.0 * (x @ lora.lora_a.T) @ lora.lora_b.T
    torch.testing.assert_close(lora(x), want)
    torch.testing.assert_close(lora.merged()(x), want, rtol=1e-5, atol=1e-5)
    assert [n for n, _ in lora.named_parameters()] == ["weight", "bias", "lora_a", "lora_b"]


def test_targets_rank_and_trainable_patterns_are_checked_by_name():
    model = build_model(_cfg().model, device="meta")
    names = add_adapters(model, LoraConfig(rank=4, targets=("blocks.*.mlp.*",)))
    assert names == ["blocks.0.mlp.fc1", "blocks.0.mlp.fc2", "blocks.1.mlp.fc1", "blocks.1.mlp.fc2"]
    trains = freeze(model, ("final.*",), lora=True)
    grads = {n for n, p in model.named_parameters() if p.requires_grad}
    assert len(grads) == trains and all(is_adapter(n) or n.startswith("final.") for n in grads)
    fresh = build_model(_cfg().model, device="meta")
    with pytest.raises(ConfigError, match=r"^train.lora.targets: 'blocks.\*.nope' matches no "):
        add_adapters(fresh, LoraConfig(rank=4, targets=("blocks.*.nope",)))
    with pytest.raises(ConfigError, match=r"^train.lora.rank: 65 is above the width of blocks"):
        add_adapters(fresh, LoraConfig(rank=65))
    with pytest.raises(ConfigError, match=r"^train.trainable: 'zzz' matches no parameter"):
        freeze(fresh, ("zzz",), lora=False)


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    """A base trained 2 steps, then a LoRA run of 3 steps from it (a checkpoint every step)."""
    root = tmp_path_factory.mktemp("lora")
    run_training(_cfg("train.steps=2"), out_dir=root / "base", progress=False)
    lora = _cfg("train.steps=3", f"train.init={root / 'base'}", "train.lora.rank=4")
    lora = apply_overrides(lora, ["train.ckpt_every=1", "train.keep_ckpts=0"])
    run_training(lora, out_dir=root / "lora", progress=False)
    return {"base": root / "base", "lora": root / "lora", "cfg": lora}


def test_a_lora_run_trains_only_its_adapters_and_checkpoints_only_them(runs):
    ckpt = runs["lora"] / "checkpoints" / "step_00000003"
    saved = _tensors(ckpt)
    assert saved and all(".lora_a" in k or ".lora_b" in k for k in saved), sorted(saved)[:5]
    assert {k.split(".")[0] for k in saved} == {"model", "ema", "optim"}
    meta = json.loads((ckpt / "state.json").read_text())["meta"]
    base_ckpt = runs["base"] / "checkpoints" / "step_00000002"
    assert meta["base"] == str(base_ckpt.resolve()) and meta["trains"]["rank"] == 4
    rows = [json.loads(line) for line in (runs["lora"] / "metrics.jsonl").open()]
    assert all(r["grad_norm"] > 0 for r in rows)  # the trained base's gates pass gradients
    base = load_dit(runs["base"], weights="model").model.state_dict()
    tuned = load_dit(runs["lora"], weights="model").model.state_dict()
    assert sorted(base) == sorted(tuned)  # merged: the plain model's names
    changed = [k for k in base if not torch.equal(base[k], tuned[k])]
    assert changed and all(".mlp." in k or "attn" in k for k in changed), changed


def test_a_lora_run_resumes_bit_identically_with_its_base(runs, tmp_path):
    copy = tmp_path / "lora"
    shutil.copytree(runs["lora"], copy)
    shutil.rmtree(copy / "checkpoints" / "step_00000003")
    summary = run_training(runs["cfg"], out_dir=copy, resume=True, progress=False)
    want = [json.loads(line) for line in (runs["lora"] / "metrics.jsonl").open()][-1]["loss"]
    assert summary["step"] == 3 and summary["metrics"]["loss"] == want


def test_merge_writes_a_plain_run_that_loads_and_starts_runs_like_any(runs, tmp_path, capsys):
    out = tmp_path / "merged"
    assert vfm_main(["checkpoint", "merge", str(runs["lora"]), "--out", str(out)]) == 0
    assert "-> " in capsys.readouterr().out
    merged = load_dit(out, weights="model")
    tuned = load_dit(runs["lora"], weights="model").model.state_dict()
    for k, v in merged.model.state_dict().items():
        torch.testing.assert_close(v, tuned[k], rtol=0, atol=1e-6)
    assert merged.cfg.train.lora.rank == 0 and merged.cfg.train.init is None
    assert not any(is_adapter(k) for k in _tensors(merged.checkpoint))
    assert open_init(str(out)).checkpoint == merged.checkpoint  # --init takes it
    with pytest.raises(CheckpointError, match="holds only what its run trained"):
        open_init(str(runs["lora"]))  # the partial run itself: merge it first
    with pytest.raises(CheckpointError, match="trains every parameter"):
        merge_checkpoint(runs["base"], tmp_path / "again")
    with pytest.raises(CheckpointError, match="exists and is not an empty directory"):
        merge_checkpoint(runs["lora"], out)


def test_trainable_patterns_freeze_the_rest_without_lora(runs, tmp_path):
    cfg = _cfg("train.steps=1", f"train.init={runs['base']}", "train.trainable=[final.*]")
    run_training(cfg, out_dir=tmp_path / "ft", progress=False)
    (ckpt,) = (tmp_path / "ft" / "checkpoints").iterdir()
    names = {k.split(".", 1)[1] for k in _tensors(ckpt) if k.startswith(("model.", "ema."))}
    assert names and all(n.startswith("final.") for n in names), names
    merged = load_dit(tmp_path / "ft", weights="model").model.state_dict()
    base = load_dit(runs["base"], weights="model").model.state_dict()
    assert all(torch.equal(merged[k], base[k]) for k in base if not k.startswith("final."))
    assert any(not torch.equal(merged[k], base[k]) for k in base if k.startswith("final."))
