"""Paper Table 3, cell by cell: sigma differs across DP and is the same across CP/TP/PP; noise
differs across DP and CP and is the same across TP/PP; weight-init shards differ across TP and
gather to the single-process init. Every layout reproduces the 1-process global draws."""

from __future__ import annotations

import pytest
import torch
from parallel_harness import run_ranks
from torch.distributed.tensor import DTensor

from vfm_core.rng import StepRNG, counter_generator

SEED, STEP, B, SHAPE = 3, 7, 2, (2, 4, 8, 3, 3)  # local batch 2 of (C, T, H, W) = (4, 8, 3, 3)
SIG = dict(p_mean=-1.2, p_std=1.2)


def _rank(dp=0, cp_rank=0, cp=1):
    # TP and PP coordinates do not enter the draws at all: same (dp, cp) -> same numbers
    return StepRNG(seed=SEED, dp_rank=dp, cp_rank=cp_rank, cp=cp)


def test_sigma_differs_across_dp_and_matches_one_process():
    a, b = _rank(dp=0).sigma(STEP, B, **SIG), _rank(dp=1).sigma(STEP, B, **SIG)
    assert not torch.allclose(a, b)
    one = StepRNG(seed=SEED).sigma(STEP, 2 * B, **SIG)  # one process, global batch 4
    assert torch.equal(torch.cat([a, b]), one)


def test_sigma_and_caption_drop_same_across_cp_tp_pp():
    base = _rank(dp=1, cp_rank=0, cp=2)
    other_cp = _rank(dp=1, cp_rank=1, cp=2)
    assert torch.equal(base.sigma(STEP, B, **SIG), other_cp.sigma(STEP, B, **SIG))
    assert torch.equal(base.keep_caption(STEP, 8, 0.5), other_cp.keep_caption(STEP, 8, 0.5))
    # a TP or PP peer has the same (dp, cp) coordinates, hence the same object state
    peer = _rank(dp=1, cp_rank=0, cp=2)
    assert torch.equal(base.sigma(STEP, B, **SIG), peer.sigma(STEP, B, **SIG))


def test_noise_differs_across_dp_and_cp_and_cp_slices_make_the_full_draw():
    full = _rank(dp=0).noise(STEP, SHAPE)  # (B, C, T, H, W)
    parts = [r.noise(STEP, SHAPE, frames=r.cp_frames(8)) for r in (_rank(0, 0, 2), _rank(0, 1, 2))]
    assert parts[0].shape == (2, 4, 4, 3, 3)
    assert not torch.allclose(parts[0], parts[1])  # differs across CP
    assert torch.equal(torch.cat(parts, dim=2), full)  # CP slices gather to the 1-process noise
    assert not torch.allclose(full, _rank(dp=1).noise(STEP, SHAPE))  # differs across DP
    assert torch.equal(full, _rank(dp=0).noise(STEP, SHAPE))  # same across TP / PP peers
    assert abs(full.std().item() - 1.0) < 0.2
    one = StepRNG(seed=SEED).noise(STEP, (4, *SHAPE[1:]))  # one process, global batch
    assert torch.equal(one[2:], _rank(dp=1).noise(STEP, SHAPE))


def test_draws_change_with_step_and_seed():
    assert not torch.equal(_rank().noise(STEP, SHAPE), _rank().noise(STEP + 1, SHAPE))
    other = StepRNG(seed=SEED + 1).sigma(STEP, B, **SIG)
    assert not torch.equal(_rank().sigma(STEP, B, **SIG), other)


def test_bad_rng_inputs_are_named():
    with pytest.raises(ValueError, match="latent frames 5 cannot be split evenly over cp=2"):
        _rank(cp_rank=1, cp=2).cp_frames(5)
    with pytest.raises(ValueError, match="purpose 'dropout' unknown"):
        counter_generator(0, "dropout", 1)
    with pytest.raises(ValueError, match="outside the 8 latent frames"):
        _rank().noise(STEP, SHAPE, frames=range(6, 10))


def _worker_init(rank, world):
    from equivalence import tiny_model_cfg

    from vfm_core.families import build_model
    from vfm_core.parallel.dims import ParallelDims
    from vfm_core.parallel.parallelize import parallelize_dit

    torch.manual_seed(0)
    ref = build_model(tiny_model_cfg("dit"))
    torch.manual_seed(0)
    model = parallelize_dit(
        build_model(tiny_model_cfg("dit")), parallel_dims=ParallelDims(tp=2, world_size=world)
    )
    ref_sd = ref.state_dict()
    out = {}
    for name, p in model.named_parameters():
        if isinstance(p, DTensor) and name.endswith(".weight"):  # biases start at zero
            out[name] = {
                "equal_full": torch.equal(p.full_tensor(), ref_sd[name]),
                "local": p.to_local().flatten()[:4].tolist(),
            }
    return out


@pytest.mark.slow
def test_weight_init_shards_differ_across_tp_and_gather_to_one_process_init():
    r0, r1 = run_ranks(_worker_init, 2)
    assert "blocks.0.self_attn.0.q.weight" in r0 and len(r0) >= 16
    for name in r0:
        assert r0[name]["equal_full"] and r1[name]["equal_full"], name
        assert r0[name]["local"] != r1[name]["local"], f"{name}: TP shards are identical"
