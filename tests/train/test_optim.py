"""The trainer's AdamW: ``optim.fused`` runs torch's fused kernel (same math to rounding as the
default ``foreach`` pass) and its state, saved by name, resumes bit-identically."""

from __future__ import annotations

import pytest
import torch

from vfm_core.config import OptimConfig
from vfm_core.train.optim import build_optimizer, load_optimizer_state, optimizer_state


def _params(seed: int = 0) -> list[torch.nn.Parameter]:
    g = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(s, generator=g)) for s in ((8, 4), (4,), (3, 3))]


def _steps(opt, params, n: int, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    for _ in range(n):
        for p in params:
            p.grad = torch.randn(p.shape, generator=g)
        opt.step()


@pytest.mark.parametrize("fused", [False, True])
def test_fused_and_foreach_agree_and_resume_bit_identically(fused):
    cfg = OptimConfig(lr=1e-2, weight_decay=0.1, warmup_steps=1, fused=fused)
    straight = _params()
    opt, _ = build_optimizer(straight, cfg, total_steps=10)
    assert bool(opt.param_groups[0].get("fused")) is fused
    _steps(opt, straight, 6, seed=1)
    # 3 steps, the state saved by name and restored into a fresh optimizer, 3 more
    names = ["a", "b", "c"]
    split = _params()
    first, _ = build_optimizer(split, cfg, total_steps=10)
    _steps(first, split, 3, seed=1)
    state = optimizer_state(first, names)
    second, _ = build_optimizer(split, cfg, total_steps=10)
    load_optimizer_state(second, names, state)
    g = torch.Generator().manual_seed(1)
    for _ in range(3):  # the same gradient stream as the straight run's first 3 steps...
        for p in split:
            torch.randn(p.shape, generator=g)
    for _ in range(3):  # ... then its last 3
        for p in split:
            p.grad = torch.randn(p.shape, generator=g)
        second.step()
    for a, b in zip(straight, split, strict=True):
        assert torch.equal(a, b)
    reference = _params()
    ref_opt, _ = build_optimizer(
        reference, OptimConfig(lr=1e-2, weight_decay=0.1, warmup_steps=1), 10
    )
    _steps(ref_opt, reference, 6, seed=1)
    for a, b in zip(straight, reference, strict=True):
        assert torch.allclose(a, b, rtol=1e-5, atol=1e-6)
