"""``model.fused_proj``: self-attention's q/k/v as one GEMM computes the same function as the
separate projections, and a state dict of either layout loads into the other (old checkpoints of
the separate layout keep loading)."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from model_init import random_model

from vfm_core.config import ModelConfig
from vfm_core.families import build_model
from vfm_core.models.attention import fuse_qkv, split_qkv

BASE = dict(in_channels=4, hidden=64, depth=2, heads=4, text_dim=16, text_len=3)
CASES = {
    "dit": dict(arch="dit"),
    "stdit_gqa": dict(arch="stdit", kv_heads=2),
    "llama_dit": dict(arch="llama_dit", norm="rms", mlp="swiglu", kv_heads=1),
    "ar": dict(arch="ar", vocab_size=40, patch=(1, 1, 1), mlp="swiglu", kv_heads=2),
}


def _inputs(cfg: ModelConfig):
    g = torch.Generator().manual_seed(3)
    text = torch.randn(2, cfg.text_len, cfg.text_dim, generator=g, dtype=torch.float64)
    if cfg.arch == "ar":
        return (torch.randint(0, cfg.vocab_size, (2, 2, 2, 4), generator=g), text)
    x = torch.randn(2, cfg.in_channels, 2, 4, 4, generator=g, dtype=torch.float64)
    return (x, torch.tensor([0.5, 2.0], dtype=torch.float64), text)


def _grads(model, inputs) -> dict[str, torch.Tensor]:
    model.zero_grad()
    model(*inputs).square().mean().backward()
    return {n: p.grad for n, p in model.named_parameters()}


@pytest.mark.parametrize("case", sorted(CASES))
def test_fused_layout_is_the_same_function(case):
    cfg = ModelConfig(**BASE, **CASES[case])
    sep = random_model(cfg, seed=7)
    fused = build_model(dataclasses.replace(cfg, fused_proj=True)).double()
    fused.load_state_dict(sep.state_dict(), strict=True)  # separate -> fused on load
    names = dict(fused.named_parameters())
    assert any(n.endswith(".qkv.weight") for n in names)
    assert not any(n.endswith(".q.weight") and "cross" not in n for n in names)
    inputs = _inputs(cfg)
    torch.testing.assert_close(fused(*inputs), sep(*inputs), rtol=1e-12, atol=1e-12)
    # gradients: the fused model's, split back into the separate layout, are the same
    g_fused, g_sep = _grads(fused, inputs), _grads(sep, inputs)
    back = build_model(cfg).double()
    back.load_state_dict(g_fused, strict=True)  # fused -> separate on load
    for name, p in back.named_parameters():
        torch.testing.assert_close(p, g_sep[name], rtol=1e-10, atol=1e-12, msg=name)
    # and the weights round-trip exactly
    back.load_state_dict(fused.state_dict(), strict=True)
    for name, p in back.named_parameters():
        assert torch.equal(p, dict(sep.named_parameters())[name]), name


def test_qkv_rows_are_whole_groups():
    """Each key/value group's rows are contiguous: [its query heads, k, v], so a column-parallel
    shard over groups is a valid attention shard; split_qkv inverts fuse_qkv."""
    d, heads, kv, c = 2, 4, 2, 3
    q = torch.arange(heads * d * c, dtype=torch.float64).view(heads * d, c)
    k = -1 - torch.arange(kv * d * c, dtype=torch.float64).view(kv * d, c)
    v = 100 + torch.arange(kv * d * c, dtype=torch.float64).view(kv * d, c)
    fused = fuse_qkv(q, k, v, kv)
    assert fused.shape == ((heads + 2 * kv) * d, c)
    first = fused[: fused.shape[0] // kv]  # group 0: query heads 0, 1 then k_0, v_0
    assert torch.equal(first, torch.cat([q[: 2 * d], k[:d], v[:d]]))
    for a, b in zip(split_qkv(fused, heads, kv), (q, k, v)):
        assert torch.equal(a, b)
