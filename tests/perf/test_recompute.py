"""Selective activation checkpointing: the trainer runs it, it trains the same losses, and the
memory it keeps is what the planner's memory model assumes (vfm_core.parallel.recompute)."""

from __future__ import annotations

import dataclasses
import functools

import pytest
import torch

from vfm_core.config import apply_overrides
from vfm_core.families import build_model
from vfm_core.parallel.recompute import checkpoint_blocks, live_saved_bytes, normalize
from vfm_core.perf.memory import block_saved_elements, measure_saved_bytes
from vfm_core.recipes import get_recipe
from vfm_core.train.trainer import Trainer

GRID = (4, 16, 16)  # latent (T, H, W)


def _saved(recipe: str, mode: str, full_blocks: int = 0) -> int:
    cfg = get_recipe(recipe).model
    torch.manual_seed(0)
    model = build_model(cfg)
    checkpoint_blocks(model.blocks, mode, full_blocks=full_blocks)
    x = torch.randn(2, cfg.in_channels, *GRID)
    c, text = torch.randn(2), torch.randn(2, cfg.text_len, cfg.text_dim)
    return live_saved_bytes(functools.partial(model, x, c, text), [*model.parameters(), x, c, text])


def _predicted(recipe: str, mode: str, full_blocks: int = 0) -> float:
    cfg = get_recipe(recipe).model
    seq = GRID[0] * GRID[1] * GRID[2] // (cfg.patch[0] * cfg.patch[1] * cfg.patch[2])
    own = lambda i: "selective" if mode == "full" and 0 < full_blocks <= i else mode  # noqa: E731
    blocks = (
        block_saved_elements(cfg, i, micro_batch=2, seq_len=seq, recompute=own(i))
        for i in range(cfg.depth)
    )
    return sum((e["act"] + e["stat"]) * 4 for e in blocks)  # CPU fp32


@pytest.mark.parametrize("recipe", ["dit-tiny", "stdit-tiny", "llama-dit-tiny"])
def test_recompute_memory_matches_the_planner_model(recipe):
    """What the blocks keep alive for the backward (measured: storages still referenced after the
    forward) drops by what block_saved_elements predicts for full and selective, within 1 %."""
    measured = {m: _saved(recipe, m) for m in ("none", "full", "selective")}
    predicted = {m: _predicted(recipe, m) for m in measured}
    for mode in ("full", "selective"):
        saved_m = measured["none"] - measured[mode]
        saved_p = predicted["none"] - predicted[mode]
        assert saved_m == pytest.approx(saved_p, rel=0.01), (mode, measured, predicted)
    assert measured["full"] < measured["selective"] < measured["none"]
    # block-wise full (parallel.activation_checkpointing_blocks): the first block whole, the
    # rest selective, in between
    k = 1
    part = _saved(recipe, "full", k)
    assert measured["none"] - part == pytest.approx(
        predicted["none"] - _predicted(recipe, "full", k), rel=0.01
    )
    assert measured["full"] < part < measured["selective"]


def test_live_bytes_agree_with_saved_tensor_hooks_without_recompute():
    cfg = get_recipe("dit-tiny").model
    torch.manual_seed(0)
    model = build_model(cfg)
    x = torch.randn(2, cfg.in_channels, *GRID)
    c, text = torch.randn(2), torch.randn(2, cfg.text_len, cfg.text_dim)
    fn = functools.partial(model, x, c, text)
    live = live_saved_bytes(fn, [*model.parameters(), x, c, text])
    hooks = measure_saved_bytes(fn, model.parameters())
    assert live == pytest.approx(hooks, rel=0.01)


def test_normalize_modes():
    assert [normalize(v) for v in (False, None, True, "none", "full", "selective")] == [
        "none",
        "none",
        "full",
        "none",
        "full",
        "selective",
    ]
    with pytest.raises(ValueError, match="choose from none, full, selective"):
        normalize("some")


def _losses(mode: str, recipe: str = "dit-tiny", full_blocks: int = 0) -> list[float]:
    sets = [
        f"parallel.activation_checkpointing_blocks={full_blocks}",
        "data.batch_size=2",
        "model.depth=2",
        "train.steps=3",
        "tracking.mlflow=false",
        "train.device=cpu",
        "train.ema_decay=0",
    ]
    if mode != "none":
        sets += [
            "parallel.activation_checkpointing=true",
            f"parallel.activation_checkpointing_mode={mode}",
        ]
    cfg = apply_overrides(get_recipe(recipe), sets)
    trainer = Trainer(cfg)
    rows: list[float] = []

    class _Log:
        def log(self, step, metrics):
            rows.append(metrics["loss"])

        def close(self):
            pass

    trainer.fit(loggers=[_Log()])
    return rows


@pytest.mark.parametrize("recipe", ["dit-tiny", "stdit-tiny"])
def test_selective_recompute_trains_the_same_losses(recipe):
    """One process, fp32 CPU: selective (and full) checkpointing change memory, not the math."""
    base = _losses("none", recipe)
    assert len(base) == 3
    for mode, k in (("selective", 0), ("full", 0), ("full", 1)):
        got = _losses(mode, recipe, k)
        assert got == pytest.approx(base, abs=1e-6, rel=1e-6), (mode, k)


@pytest.mark.parametrize(
    "sets, match",
    [
        (["parallel.activation_checkpointing_blocks=-1"], "must be >= 0"),
        (["parallel.activation_checkpointing_blocks=1"], "needs parallel.activation_checkpointing"),
        (
            [
                "parallel.activation_checkpointing=true",
                "parallel.activation_checkpointing_mode=selective",
                "parallel.activation_checkpointing_blocks=1",
            ],
            "mode=full",
        ),
        (
            [
                "parallel.activation_checkpointing=true",
                "parallel.activation_checkpointing_blocks=5",
            ],
            "exceeds the 2 blocks",
        ),
    ],
)
def test_block_wise_recompute_refuses_bad_settings(sets, match):
    from vfm_core.config import ConfigError
    from vfm_core.parallel.layout import validate_layout

    cfg = apply_overrides(get_recipe("dit-tiny"), ["model.depth=2", *sets])
    with pytest.raises(ConfigError, match=f"parallel.activation_checkpointing_blocks.*{match}"):
        validate_layout(cfg, 1)


def test_block_wise_recompute_reaches_the_blocks():
    sets = ["parallel.activation_checkpointing=true", "parallel.activation_checkpointing_blocks=1"]
    cfg = apply_overrides(get_recipe("dit-tiny"), ["model.depth=3", "train.device=cpu", *sets])
    blocks = list(Trainer(cfg).model.blocks.values())
    selective = ["context_fn" in getattr(b.forward, "keywords", {}) for b in blocks]
    assert selective == [False, True, True]


def test_config_field_reaches_the_blocks():
    sets = [
        "parallel.activation_checkpointing=true",
        "model.depth=2",
        "train.device=cpu",
        "parallel.activation_checkpointing_mode=selective",
    ]
    cfg = apply_overrides(get_recipe("dit-tiny"), sets)
    trainer = Trainer(cfg)
    fwd = next(iter(trainer.model.blocks.values())).forward
    assert "context_fn" in getattr(fwd, "keywords", {}), "selective policy not applied"
    assert dataclasses.fields(type(cfg.parallel))  # typed config keeps the new field
