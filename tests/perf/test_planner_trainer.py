"""The planner and the trainer agree: every layout ``plan`` returns converts (``trainer_config``,
the function ``vfm plan`` uses) into a run config the trainer accepts — ``validate_layout`` and
the checks ``parallelize_dit`` makes on the model — and layouts the trainer refuses (virtual
pipeline stages, PP x CP, microbatches other than pp) are refused by the planner too."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest

from vfm_core.config import ConfigError
from vfm_core.parallel.layout import validate_layout
from vfm_core.parallel.parallelize import _check
from vfm_core.perf.flops import default_grid
from vfm_core.perf.planner import global_batch, plan, trainer_config
from vfm_core.recipes import get_recipe

CASES = [
    ("dit-7b", 8192, 64),
    ("dit-7b", 73728, 256),
    ("dit-28b", 8192, 64),
    ("dit-28b", 73728, 64),
    ("stdit-7b", 35840, 64),
    ("stdit-12b", 73728, 256),
    ("llama-dit-28b", 8192, 256),
    ("dit-tiny", 256, 8),
    ("ar-4b", 12800, 64),  # the autoregressive family: no PP x TP, balanced causal ring CP
    ("ar-tiny", 192, 8),
]


def _run_config(recipe: str, seq: int):
    cfg = get_recipe(recipe)
    t, h, w = default_grid(seq)
    pt, ph, pw = cfg.model.patch
    data = dataclasses.replace(
        cfg.data, latent_frames=t * pt, latent_height=h * ph, latent_width=w * pw, max_tokens=0
    )
    return dataclasses.replace(cfg, data=data)


@pytest.mark.parametrize(("recipe", "seq", "gpus"), CASES)
def test_every_planned_layout_is_one_the_trainer_runs(recipe, seq, gpus):
    base = _run_config(recipe, seq)
    result = plan(base.model, seq_len=seq, gpus=gpus)
    seen = set()
    for p in result.plans:
        lay = p.layout
        assert lay.vpp == 1 and not (lay.pp > 1 and lay.cp > 1) and lay.microbatches == lay.pp
        key = dataclasses.replace(lay, micro_batch=1)
        if key in seen:
            continue
        seen.add(key)
        cfg = trainer_config(base, lay)
        assert cfg.data.batch_size == global_batch(lay)
        dims = validate_layout(cfg, lay.world)  # raises ConfigError if the trainer refuses
        assert (dims.dp_replicate, dims.dp_shard, dims.tp, dims.cp, dims.pp) == (
            lay.dp_replicate, lay.dp_shard, lay.tp, lay.cp, lay.pp,
        )  # fmt: skip
        assert cfg.data.batch_size // dims.dp // dims.pp == lay.micro_batch
        if lay.pp == 1:  # the model-level checks of parallelize_dit (stdit ring, a2a heads)
            _check(SimpleNamespace(cfg=cfg.model), dims, cfg.parallel.cp_mode)
        split = lay.cp * (lay.tp if lay.sp else 1)
        assert seq % split == 0
        want = (
            "none"
            if not cfg.parallel.activation_checkpointing
            else (cfg.parallel.activation_checkpointing_mode)
        )
        assert want == lay.recompute
    assert seen


@pytest.mark.parametrize(
    ("fixed", "match"),
    [
        ("vpp=2,pp=2", "interleaved 1F1B"),
        ("pp=2,cp=2", "does not combine PP and CP"),
        ("pp=2,microbatches=4", "exactly pp=2"),
    ],
)
def test_planner_refuses_what_the_trainer_refuses(fixed, match):
    with pytest.raises(ConfigError, match=match):
        plan(get_recipe("dit-7b").model, seq_len=8192, gpus=64, fixed=fixed)
    # and the trainer refuses PP x CP itself
    if "cp" in fixed:
        base = _run_config("dit-7b", 8192)
        bad = dataclasses.replace(base.parallel, pp=2, cp=2, dp_shard=1)
        with pytest.raises(ConfigError, match="pipeline x context"):
            validate_layout(dataclasses.replace(base, parallel=bad), 4)


def test_ar_memory_counts_the_logits_and_its_parameters():
    """The causal model's parameters are counted exactly, and its logits (N x V, fp32 in the
    loss) are part of the activations, divided by the TP degree (vocabulary-parallel head)."""
    from vfm_core.models.dit import build_model, count_params
    from vfm_core.perf.memory import estimate_memory, param_count

    m = get_recipe("ar-4b").model
    assert param_count(m) == count_params(build_model(m, device="meta"))
    one = estimate_memory(m, seq_len=12800, hbm_gb=80, tp=1).activations_gib
    two = estimate_memory(m, seq_len=12800, hbm_gb=80, tp=2).activations_gib
    logits_gib = 12800 * m.vocab_size * (2 + 4 + 4) / 2**30
    assert one > logits_gib and one - two > logits_gib / 2 * 0.99
