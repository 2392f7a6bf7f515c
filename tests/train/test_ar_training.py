"""The autoregressive family on the one trainer: ar-tiny's next-token loss falls from ln(vocab) on
the synthetic token source, MFU is logged, a resume continues bit-identically, and the layouts
the family does not run (yet) are refused in one line. Its parallel layouts are in
tests/parallel/test_4d_training.py and test_causal_context.py."""

from __future__ import annotations

import json
import math

import pytest

from vfm_core.config import ConfigError, apply_overrides
from vfm_core.parallel.layout import validate_layout, with_degrees
from vfm_core.recipes import get_recipe
from vfm_core.train.main import run_training

SMALL = [
    "model.depth=2",
    "data.batch_size=4",
    "optim.lr=0.003",
    "optim.warmup_steps=2",
    "train.log_every=1",
    "tracking.mlflow=false",
]


def _rows(out):
    return [json.loads(x) for x in (out / "metrics.jsonl").open()]


def test_ar_tiny_learns_and_resumes_bit_identically(tmp_path):
    cfg = apply_overrides(get_recipe("ar-tiny"), [*SMALL, "train.steps=30", "train.ckpt_every=20"])
    run_training(cfg, out_dir=tmp_path / "full", progress=False)
    rows = _rows(tmp_path / "full")
    assert rows[0]["loss"] == pytest.approx(math.log(cfg.model.vocab_size), rel=0.05)
    assert sum(r["loss"] for r in rows[-5:]) / 5 < 0.6 * rows[0]["loss"]
    # MFU against the CPU peak measured at start (noisy under load): logged and positive
    assert all(r["mfu"] > 0 and r["tflops"] > 0 and r["tokens_per_s"] > 0 for r in rows)
    # stop at 20, resume to 30: the same losses
    half = apply_overrides(cfg, ["train.steps=20"])
    run_training(half, out_dir=tmp_path / "resumed", progress=False)
    run_training(cfg, out_dir=tmp_path / "resumed", resume=True, progress=False)
    assert [r["loss"] for r in _rows(tmp_path / "resumed")] == [r["loss"] for r in rows]


def test_ar_layouts_it_cannot_run_are_refused_in_one_line():
    validate_layout(with_degrees(get_recipe("ar-tiny"), pp=2, tp=2), 4)  # PP x TP trains
    odd = apply_overrides(
        get_recipe("ar-tiny"),
        ["data.latent_frames=1", "data.latent_height=3", "data.latent_width=3"],
    )
    with pytest.raises(ConfigError, match="9 tokens"):
        validate_layout(with_degrees(odd, cp=2), 2)
