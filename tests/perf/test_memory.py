"""The memory model: parameter counts, the activation model against the real modules, sharding.

The activation model (:func:`vfm_core.perf.memory.model_saved_bytes`) is checked against the bytes
autograd actually saves in a forward of the real modules on CPU (fp32, torch SDPA — the flash-style
kernel that saves q, k, v, output and log-sum-exp), counted with saved-tensor hooks, one count per
storage. The issue asks for agreement within 10%; the model is built op by op and lands on 0%.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from vfm_core.config import ModelConfig
from vfm_core.families import build_model
from vfm_core.models.dit import count_params
from vfm_core.perf.memory import (
    FRAMEWORK_OVERHEAD_GIB,
    USABLE_FRACTION,
    Split,
    block_param_split,
    block_saved_elements,
    estimate_memory,
    measure_saved_bytes,
    model_saved_bytes,
    param_count,
)
from vfm_core.recipes import get_recipe

# (recipe, overrides): the three tiny presets and three mid-size variants (AdaLN-Zero, ST-DiT with
# a full-attention block, GQA without QK norm)
CASES = {
    "dit-tiny": ("dit-tiny", {}),
    "stdit-tiny": ("stdit-tiny", {}),
    "llama-dit-tiny": ("llama-dit-tiny", {}),
    "dit-mid-zero": ("dit-tiny", {"hidden": 768, "heads": 12, "depth": 2, "adaln": "zero"}),
    "stdit-mid-full3": (
        "stdit-tiny",
        {"hidden": 512, "heads": 8, "depth": 3, "stdit_full_every": 3},
    ),
    "llama-mid-gqa": (
        "llama-dit-tiny",
        {"hidden": 640, "heads": 10, "kv_heads": 2, "depth": 2, "qk_norm": False},
    ),
    "dit-pooled": ("dit-tiny", {"text_conditioning": "pooled"}),  # no cross-attention
}


def _cfg(name: str) -> ModelConfig:
    recipe, over = CASES[name]
    return dataclasses.replace(get_recipe(recipe).model, **over)


def measure(cfg: ModelConfig, *, batch: int, latent: tuple[int, int, int]) -> tuple[int, int]:
    """(measured, predicted) saved bytes of one forward on CPU."""
    torch.manual_seed(0)
    model = build_model(cfg)
    t, h, w = latent
    x = torch.randn(batch, cfg.in_channels, t, h, w)
    c_noise = torch.randn(batch)
    text = torch.randn(batch, cfg.text_len, cfg.text_dim)
    measured = measure_saved_bytes(lambda: model(x, c_noise, text), model.parameters())
    pt, ph, pw = cfg.patch
    seq = (t // pt) * (h // ph) * (w // pw)
    predicted = model_saved_bytes(cfg, micro_batch=batch, seq_len=seq)["total"]
    return measured, int(predicted)


@pytest.mark.parametrize("name", list(CASES))
def test_activation_model_matches_autograd(name):
    cfg = _cfg(name)
    measured, predicted = measure(cfg, batch=2, latent=(4, 16, 16))
    assert abs(predicted - measured) / measured < 0.10, (predicted, measured)
    assert predicted == measured  # the op-by-op model is exact on CPU fp32


@pytest.mark.parametrize("name", ["dit-tiny", "stdit-mid-full3"])
def test_activation_model_other_shapes(name):
    cfg = _cfg(name)
    measured, predicted = measure(cfg, batch=1, latent=(2, 8, 24))  # non-square grid, batch 1
    assert abs(predicted - measured) / measured < 0.10


def test_measure_counts_each_storage_once():
    w = torch.randn(8, 8, requires_grad=True)
    x = torch.randn(4, 8, requires_grad=True)

    def fn():
        y = x * 2.0  # saves nothing big (scalar)
        z = y @ w  # saves y (4×8) and w (parameter, excluded)
        return (z * y.t().t()).sum()  # saves z and the view y again (same storage)

    assert measure_saved_bytes(fn, [w]) == 2 * 4 * 8 * 4


@pytest.mark.parametrize("name", list(CASES))
def test_param_count_matches_module(name):
    cfg = _cfg(name)
    assert param_count(cfg) == count_params(build_model(cfg, device="meta"))


@pytest.mark.parametrize(
    "over",
    [
        {},
        {"text_conditioning": "pooled"},
        {"text_conditioning": "pooled", "mlp": "gelu"},
        {"text_conditioning": "pooled", "mlp": "gelu_exact", "mlp_bias": False},
    ],
)
def test_param_count_matches_module_ar(over):
    cfg = dataclasses.replace(get_recipe("ar-tiny").model, **over)
    assert param_count(cfg) == count_params(build_model(cfg, device="meta"))


def test_param_count_without_mlp_biases():
    cfg = dataclasses.replace(get_recipe("dit-tiny").model, mlp_bias=False)
    model = build_model(cfg, device="meta")
    assert param_count(cfg) == count_params(model)
    mods = dict(model.named_modules())
    assert mods["blocks.0.mlp.fc1"].bias is None and mods["blocks.0.mlp.fc2"].bias is None


@pytest.mark.parametrize("recipe", ["dit-7b", "stdit-12b", "llama-dit-7b"])
def test_param_count_paper_scale(recipe):
    cfg = get_recipe(recipe).model
    assert param_count(cfg) == count_params(build_model(cfg, device="meta"))


def test_activation_splits_follow_korthikanti():
    cfg = get_recipe("dit-7b").model
    kw = dict(micro_batch=1, seq_len=8192)
    base = block_saved_elements(cfg, 0, **kw)["act"]
    cp4 = block_saved_elements(cfg, 0, split=Split(cp=4), **kw)["act"]
    tp_sp = block_saved_elements(cfg, 0, split=Split(tp=8, sp=True), **kw)["act"]
    tp_nosp = block_saved_elements(cfg, 0, split=Split(tp=8), **kw)["act"]
    assert cp4 == pytest.approx(base / 4, rel=0.05)  # text k/v are per sample, not per token
    # Korthikanti's SP splits everything by t but the linear inputs: torch's SP keeps the
    # all-gathered input of the q/k/v, cross-attention q and MLP linears (Megatron re-gathers it)
    gathered = 8192 * 3 * cfg.hidden * (1 - 1 / 8)
    assert tp_sp == pytest.approx(base / 8 + gathered, rel=0.05)
    assert base / 8 < tp_nosp < base / 2  # hidden-width tensors stay whole without SP
    sel = block_saved_elements(cfg, 0, recompute="selective", **kw)["act"]
    full = block_saved_elements(cfg, 0, recompute="full", **kw)["act"]
    assert full == 8192 * cfg.hidden  # the block input only
    assert full < sel < base / 2
    # per token of a GELU DiT block with QK norm: 22·D + 2·F = 30·D elements
    per_tok = (base - 2 * cfg.text_len * 3 * cfg.hidden) / 8192  # minus text k/v, per sample
    assert per_tok == pytest.approx(30 * cfg.hidden, rel=0.01)


def test_estimate_memory_states_and_sharding():
    cfg = get_recipe("dit-7b").model
    n = param_count(cfg)
    kw = dict(seq_len=8192, hbm_gb=80, recompute="full")
    ddp = estimate_memory(cfg, dp_shard=1, **kw)
    fsdp = estimate_memory(cfg, dp_shard=8, **kw)
    gib = 2**30
    assert ddp.params_gib + ddp.grads_gib + ddp.optimizer_gib == pytest.approx(16 * n / gib)
    assert fsdp.optimizer_gib == pytest.approx(ddp.optimizer_gib / 8)
    assert ddp.fsdp_buffers_gib == 0 and fsdp.fsdp_buffers_gib > 0
    assert not ddp.fits and ddp.margin_gib < 0  # 116 GiB of states alone
    assert fsdp.fits and fsdp.margin_gib > 0
    assert fsdp.capacity_gib == pytest.approx(80 * USABLE_FRACTION)
    assert fsdp.overhead_gib == FRAMEWORK_OVERHEAD_GIB
    assert fsdp.ema_gib == pytest.approx(fsdp.params_gib)  # fp32 EMA shards, like the weights
    tp = estimate_memory(cfg, dp_shard=8, tp=2, sp=True, **kw)
    # TP halves the projections and MLPs; norms, AdaLN and the embeddings stay whole
    split = sum(block_param_split(cfg, i)[0] for i in range(cfg.depth))
    assert tp.optimizer_gib == pytest.approx(fsdp.optimizer_gib * (1 - split / 2 / n))
    assert fsdp.optimizer_gib / 2 < tp.optimizer_gib < fsdp.optimizer_gib * 0.6
    assert tp.activations_gib < fsdp.activations_gib


def test_pipeline_in_flight_microbatches():
    cfg = get_recipe("dit-7b").model
    kw = dict(seq_len=8192, hbm_gb=80, dp_shard=8, recompute="none")
    one = estimate_memory(cfg, pp=4, microbatches=1, **kw).activations_gib
    four = estimate_memory(cfg, pp=4, microbatches=16, **kw).activations_gib
    assert four == pytest.approx(4 * one)  # 1F1B: pp micro-batches in flight on stage 0
    whole = estimate_memory(cfg, pp=1, **kw).activations_gib
    assert four == pytest.approx(whole, rel=0.02)  # pp × (depth/pp) layers ≈ all layers


def test_recompute_orders_memory():
    cfg = get_recipe("stdit-7b").model
    kw = dict(seq_len=73728, hbm_gb=80, dp_shard=64)
    none, sel, full = (
        estimate_memory(cfg, recompute=r, **kw).activations_gib
        for r in ("none", "selective", "full")
    )
    assert full < sel < none


GPU_CASES = {  # name: (recipe, overrides, batch, latent)
    "dit-768": ("dit-tiny", {"hidden": 768, "heads": 12, "depth": 4}, 2, (8, 32, 32)),
    "stdit-1024-full3": (
        "stdit-tiny",
        {"hidden": 1024, "heads": 8, "depth": 3, "stdit_full_every": 3},
        2,
        (8, 32, 32),
    ),
    "llama-1024-gqa": (
        "llama-dit-tiny",
        {"hidden": 1024, "heads": 8, "kv_heads": 2},
        2,
        (8, 32, 32),
    ),
    "dit-7b-2blocks": ("dit-7b", {"depth": 2}, 1, (8, 64, 64)),
}


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(GPU_CASES))
def test_activation_model_matches_autograd_cuda_bf16(name):
    """The GPU form of the model (bf16, fused QK RMSNorm, cuDNN/flash SDPA) against CUDA."""
    recipe, over, batch, (t, h, w) = GPU_CASES[name]
    cfg = dataclasses.replace(get_recipe(recipe).model, **over)
    torch.manual_seed(0)
    model = build_model(cfg, device="cuda").to(torch.bfloat16)
    x = torch.randn(batch, cfg.in_channels, t, h, w, device="cuda", dtype=torch.bfloat16)
    c_noise = torch.randn(batch, device="cuda")
    text = torch.randn(batch, cfg.text_len, cfg.text_dim, device="cuda", dtype=torch.bfloat16)
    measured = measure_saved_bytes(lambda: model(x, c_noise, text), model.parameters())
    pt, ph, pw = cfg.patch
    seq = (t // pt) * (h // ph) * (w // pw)
    pred = model_saved_bytes(cfg, micro_batch=batch, seq_len=seq, act_bytes=2)
    assert abs(pred["total"] - measured) / measured < 0.10, (pred["total"], measured)
