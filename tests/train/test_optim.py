"""The trainer's AdamW: ``optim.fused`` (default 'auto') runs torch's fused kernel, same math to
rounding as the ``foreach`` pass of ``optim.fused=false``; its state, saved by name, resumes
bit-identically."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from vfm_core.config import OptimConfig
from vfm_core.train.optim import build_optimizer, load_optimizer_state, optimizer_state

SHAPES = ((8, 4), (4,), (3, 3))
NAMES = ["a", "b", "c"]


def _params() -> list[torch.nn.Parameter]:
    g = torch.Generator().manual_seed(0)
    return [torch.nn.Parameter(torch.randn(s, generator=g)) for s in SHAPES]


def _grads(steps: int) -> list[list[torch.Tensor]]:
    """The gradients of ``steps`` steps, the same stream for every run."""
    g = torch.Generator().manual_seed(1)
    return [[torch.randn(s, generator=g) for s in SHAPES] for _ in range(steps)]


def _step(opt, params, grads) -> None:
    for step_grads in grads:
        for p, grad in zip(params, step_grads, strict=True):
            p.grad = grad.clone()
        opt.step()


@pytest.mark.parametrize("fused", [False, True])
def test_fused_and_foreach_agree_and_resume_bit_identically(fused):
    cfg = OptimConfig(lr=1e-2, weight_decay=0.1, warmup_steps=1, fused=fused)
    grads = _grads(6)
    straight = _params()
    opt, _ = build_optimizer(straight, cfg, total_steps=10)
    assert bool(opt.param_groups[0].get("fused")) is fused
    _step(opt, straight, grads)
    # 3 steps, the state saved by name and restored into a fresh optimizer, 3 more
    split = _params()
    first, _ = build_optimizer(split, cfg, total_steps=10)
    _step(first, split, grads[:3])
    second, _ = build_optimizer(split, cfg, total_steps=10)
    load_optimizer_state(second, NAMES, optimizer_state(first, NAMES))
    _step(second, split, grads[3:])
    for a, b in zip(straight, split, strict=True):
        assert torch.equal(a, b)
    reference = _params()  # the foreach pass (the schedule sets the first lr: same warm-up)
    ref_opt, _ = build_optimizer(reference, dataclasses.replace(cfg, fused=False), 10)
    _step(ref_opt, reference, grads)
    for a, b in zip(straight, reference, strict=True):
        assert torch.allclose(a, b, rtol=1e-5, atol=1e-6)


def test_auto_is_fused_on_cpu_and_the_setting_parses():
    from vfm_core.config import apply_overrides
    from vfm_core.recipes import get_recipe

    cfg = get_recipe("dit-tiny")
    assert cfg.optim.fused == "auto"
    opt, _ = build_optimizer(_params(), cfg.optim, total_steps=10)
    assert opt.param_groups[0]["fused"] and not opt.param_groups[0].get("foreach")
    off = apply_overrides(cfg, ["optim.fused=false"])
    opt, _ = build_optimizer(_params(), off.optim, total_steps=10)
    assert not opt.param_groups[0].get("fused") and opt.param_groups[0]["foreach"]
    assert apply_overrides(cfg, ["optim.fused=true"]).optim.fused is True
    with pytest.raises(ValueError, match="optim.fused"):
        apply_overrides(cfg, ["optim.fused=yes"])


def test_a_resume_trains_with_the_runs_settings_and_names_what_changed():
    """The moments come from the checkpoint, the hyper-parameters and the schedule's peak from
    the run's ``optim`` settings (``--resume --set optim.lr=...``); unchanged settings restore
    the saved learning rate exactly."""
    from vfm_core.train.optim import restore_schedule

    cfg = OptimConfig(lr=1e-2, weight_decay=0.1, warmup_steps=4)
    params = _params()
    opt, sched = build_optimizer(params, cfg, total_steps=10)
    for step_grads in _grads(3):
        for p, grad in zip(params, step_grads, strict=True):
            p.grad = grad
        opt.step()
        sched.step()
    saved, at = optimizer_state(opt, NAMES), sched.state_dict()
    same, same_sched = build_optimizer(_params(), cfg, total_steps=10)
    assert load_optimizer_state(same, NAMES, saved) == []
    restore_schedule(same_sched, at)
    assert same.param_groups[0]["lr"] == opt.param_groups[0]["lr"] == sched.get_last_lr()[0]
    other = dataclasses.replace(cfg, lr=1e-3, weight_decay=0.5)
    new, new_sched = build_optimizer(_params(), other, total_steps=10)
    changed = load_optimizer_state(new, NAMES, saved)
    assert changed == [
        "optim.lr: 0.01 in the checkpoint, 0.001 now",
        "optim.weight_decay: 0.1 in the checkpoint, 0.5 now",
    ]
    restore_schedule(new_sched, at)
    assert new.param_groups[0]["lr"] == pytest.approx(1e-3)  # warm-up done: (3 + 1) / 4 of the peak
    assert new.param_groups[0]["weight_decay"] == 0.5
    assert torch.equal(
        new.state[new.param_groups[0]["params"][0]]["exp_avg"], opt.state[params[0]]["exp_avg"]
    )
