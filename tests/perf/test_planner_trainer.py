"""The planner and the trainer agree: every layout ``plan`` returns — 4D (TP x SP x CP x PP) and
interleaved pipelines included — converts (``trainer_config``, the function ``vfm plan`` uses) into
a run config the trainer accepts (``validate_layout`` and the checks ``parallelize_dit`` makes on
the model), and the pipeline schedule rules (``parallel.pp_microbatches``,
``parallel.pp_virtual_stages``, ``train.grad_accum``) are refused by both alike, each naming the
key."""

from __future__ import annotations

import dataclasses
import itertools
from types import SimpleNamespace

import pytest
import torch

from vfm_core.config import ConfigError
from vfm_core.geometry import default_grid
from vfm_core.parallel.context import seq_chunk
from vfm_core.parallel.layout import validate_layout
from vfm_core.parallel.parallelize import check_parallel_fit
from vfm_core.perf.hardware import gpu_spec
from vfm_core.perf.layout_rules import check_layout, global_batch, trainer_config
from vfm_core.perf.planner import Layout, plan
from vfm_core.recipes import get_recipe

CASES = [
    ("dit-7b", 8192, 64),
    ("dit-7b", 73728, 256),
    ("dit-28b", 8192, 64),
    ("dit-28b", 73728, 64),
    ("dit-28b", 73728, 256),  # the paper's TP8 x SP x CP4 x PP4 row among them
    ("stdit-7b", 35840, 64),
    ("stdit-12b", 73728, 256),
    ("llama-dit-28b", 8192, 256),
    ("dit-tiny", 256, 8),
    ("ar-4b", 12800, 64),  # the autoregressive family: PP x TP, balanced causal ring CP
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


def _check_trainer_accepts(base, lay: Layout, seq: int) -> None:
    cfg = trainer_config(base, lay)
    assert cfg.data.batch_size == global_batch(lay)
    dims = validate_layout(cfg, lay.world)  # raises ConfigError if the trainer refuses
    assert (dims.dp_replicate, dims.dp_shard, dims.tp, dims.cp, dims.pp) == (
        lay.dp_replicate,
        lay.dp_shard,
        lay.tp,
        lay.cp,
        lay.pp,
    )
    p = cfg.parallel
    if lay.pp > 1:  # the layout's micro-batches are the pipeline schedule's
        assert (p.pp_microbatches, cfg.train.grad_accum) == (lay.microbatches, 1)
        want = "interleaved_1f1b" if lay.vpp > 1 else "1f1b"
        assert (p.pp_schedule, p.pp_virtual_stages) == (want, lay.vpp)
    else:  # ... or gradient accumulation
        assert (p.pp_microbatches, cfg.train.grad_accum) == (0, lay.microbatches)
    assert cfg.data.batch_size // dims.dp // lay.microbatches == lay.micro_batch
    check_parallel_fit(SimpleNamespace(cfg=cfg.model), dims, p.cp_mode)  # stdit ring, a2a heads
    split = lay.cp * (lay.tp if lay.sp else 1)
    assert seq % split == 0
    mode = "none" if not p.activation_checkpointing else p.activation_checkpointing_mode
    assert mode == lay.recompute
    assert p.activation_checkpointing_blocks == lay.recompute_blocks


@pytest.mark.parametrize(("recipe", "seq", "gpus"), CASES)
def test_every_planned_layout_is_one_the_trainer_runs(recipe, seq, gpus):
    base = _run_config(recipe, seq)
    result = plan(base.model, seq_len=seq, gpus=gpus)
    seen = set()
    for p in result.plans:
        # one run: every layout's config trains the same data.batch_size
        assert trainer_config(base, p.layout).data.batch_size == result.global_batch
        key = dataclasses.astuple(dataclasses.replace(p.layout, micro_batch=1))
        if key not in seen:
            seen.add(key)
            _check_trainer_accepts(base, p.layout, seq)
    assert seen


def test_4d_and_interleaved_layouts_are_planned_and_accepted():
    """The search returns PP x CP (x TP x SP) and interleaved layouts, and the trainer runs them:
    the paper's 28B long-context row among them."""
    base = _run_config("dit-28b", 73728)
    plans = plan(base.model, seq_len=73728, gpus=256).plans
    four_d = [p.layout for p in plans if min(p.layout.tp, p.layout.cp, p.layout.pp) > 1]
    interleaved = [p.layout for p in plans if p.layout.vpp > 1]
    assert four_d and interleaved and any(x.sp for x in four_d)
    assert any(x.vpp > 1 for x in four_d) and any(x.microbatches > x.pp for x in four_d)
    paper = [x for x in four_d if (x.tp, x.cp, x.pp, x.sp, x.vpp) == (8, 4, 4, True, 1)]
    assert paper
    for lay in (four_d[0], interleaved[0], paper[0]):
        _check_trainer_accepts(base, lay, 73728)
    # gradient accumulation without a pipeline: what a replica's share of the global batch
    # leaves after the micro-batch (pinned here to 4 accumulation steps)
    acc = plan(base.model, seq_len=73728, gpus=256, fixed="pp=1,microbatches=4").plans
    assert acc and all(p.layout.microbatches == 4 for p in acc)
    _check_trainer_accepts(base, acc[0].layout, 73728)
    searched = [p.layout for p in plans if p.layout.pp == 1 and p.layout.microbatches > 1]
    assert searched
    _check_trainer_accepts(base, searched[0], 73728)


@pytest.mark.parametrize(
    ("recipe", "layout", "planner_says", "trainer_says"),
    [
        # 28 blocks cannot be cut into 2 x 4 equal virtual stages
        ("dit-7b", Layout(pp=2, vpp=4, microbatches=4), "vpp=4", "parallel.pp_virtual_stages"),
        # 1F1B needs a micro-batch per stage
        ("dit-7b", Layout(pp=4, microbatches=2), "microbatches=2", "parallel.pp_microbatches"),
        ("dit-28b", Layout(pp=4, vpp=2, microbatches=3), "microbatches=3", "pp_microbatches"),
        # interleaved: 9 micro-batches are not 2 equal rounds
        ("dit-28b", Layout(pp=4, vpp=2, microbatches=9), "microbatches=9", "pp_microbatches"),
    ],
)
def test_planner_refuses_what_the_trainer_refuses(recipe, layout, planner_says, trainer_says):
    h100 = gpu_spec("h100")
    base = _run_config(recipe, 8192)
    why = check_layout(base.model, layout, seq_len=8192, gpu=h100)
    assert why and planner_says in why
    with pytest.raises(ConfigError, match=trainer_says):
        validate_layout(trainer_config(base, layout), layout.world)
    fixed = f"pp={layout.pp},vpp={layout.vpp},microbatches={layout.microbatches}"
    with pytest.raises(ConfigError, match=planner_says):
        plan(base.model, seq_len=8192, gpus=64, fixed=fixed)


def test_schedule_rules_mirror_validate_layout():
    """Over a grid of pipeline schedules the planner accepts exactly what the trainer accepts
    (the planner is stricter in two stated ways: equal stages, and no virtual stages without a
    pipeline, which the trainer ignores)."""
    h100 = gpu_spec("h100")
    base = _run_config("dit-28b", 8192)  # 48 blocks
    for pp, vpp, m, mb in itertools.product((1, 2, 3, 4), (1, 2, 3, 5), range(1, 13), (1, 2)):
        lay = Layout(pp=pp, vpp=vpp, microbatches=m, micro_batch=mb, dp_shard=2)
        planner_ok = check_layout(base.model, lay, seq_len=8192, gpu=h100) is None
        try:
            validate_layout(trainer_config(base, lay), lay.world)
            trainer_ok = True
        except ConfigError:
            trainer_ok = False
        stricter = (pp == 1 and vpp > 1) or base.model.depth % pp != 0
        assert planner_ok == (trainer_ok and not stricter), lay


def _trainer_cuts(tokens: int, cp: int, sp: int) -> bool:
    """Whether the trainer's own split of a sequence (``_split_sequence`` of a DiT: every CP
    rank's contiguous chunk, then every sequence-parallel TP rank's chunk of it) succeeds."""
    x = torch.zeros(1, tokens, 1)
    try:
        for c, t in itertools.product(range(cp), range(sp)):
            seq_chunk(seq_chunk(x, c, cp), t, sp)
    except ValueError:  # "sequence of N tokens cannot be split evenly over P ranks"
        return False
    return True


def test_sequence_split_is_refused_by_config_and_planner_exactly_where_the_trainer_fails():
    """Every token count up to 24 under every CP x TP (with and without SP) on up to 16 ranks:
    the run config (``validate_layout``, before launch) and the planner (``check_layout``) refuse
    exactly the layouts whose sequence the trainer cannot cut (it failed on every rank)."""
    h100 = gpu_spec("h100")
    base = get_recipe("dit-tiny")  # patch 1x2x2: a (tokens)x2x2 latent is that many tokens
    grid = itertools.product(range(1, 25), (1, 2, 3, 4), (1, 2, 4), (False, True))
    for tokens, cp, tp, sp in grid:
        if sp and tp == 1:
            continue
        lay = Layout(cp=cp, tp=tp, sp=sp)
        data = dataclasses.replace(base.data, latent_frames=tokens, latent_height=2, latent_width=2)
        try:
            validate_layout(trainer_config(dataclasses.replace(base, data=data), lay), lay.world)
            config_ok = True
        except ConfigError:
            config_ok = False
        planner_ok = check_layout(base.model, lay, seq_len=tokens, gpu=h100) is None
        trainer_ok = _trainer_cuts(tokens, cp, tp if sp else 1)
        assert config_ok == planner_ok == trainer_ok, (tokens, lay)


def test_ar_memory_counts_the_logits_and_its_parameters():
    """The causal model's parameters are counted exactly, and its logits (N x V, fp32 in the
    loss) are part of the activations, divided by the TP degree (vocabulary-parallel head)."""
    from vfm_core.families import build_model
    from vfm_core.models.dit import count_params
    from vfm_core.perf.memory import estimate_memory, param_count

    m = get_recipe("ar-4b").model
    assert param_count(m) == count_params(build_model(m, device="meta"))
    one = estimate_memory(m, seq_len=12800, hbm_gb=80, tp=1).activations_gib
    two = estimate_memory(m, seq_len=12800, hbm_gb=80, tp=2).activations_gib
    logits_gib = 12800 * m.vocab_size * (2 + 4 + 4) / 2**30
    assert one > logits_gib and one - two > logits_gib / 2 * 0.99
