"""FP8 adapter: the selection and its fallback on CPU; the TE conversion and FP8 step on a GPU."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from fp8_gpu import require_fp8_backend

from vfm_core.config import ConfigError, validate
from vfm_core.models.dit import build_model
from vfm_core.models.fp8 import (
    drop_fp8_state,
    fp8_autocast,
    fp8_linear_names,
    fp8_status,
    resolve_fp8,
    to_te_linears,
)
from vfm_core.recipes import get_recipe

cpu_only = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU fallback")


@cpu_only
def test_auto_falls_back_and_on_is_refused_without_cuda():
    assert fp8_status() == (False, "no CUDA device")
    assert resolve_fp8("off") == (False, "off (configured)")
    assert resolve_fp8("auto") == (False, "off (no CUDA device)")
    with pytest.raises(ConfigError, match="train.fp8: 'on' requested but FP8 cannot run: no CUDA"):
        resolve_fp8("on")
    with pytest.raises(ConfigError, match="train.fp8: cannot convert linears"):
        to_te_linears(build_model(get_recipe("dit-tiny").model))


def test_unknown_setting_and_tp_combination_are_named():
    with pytest.raises(ConfigError, match="train.fp8: unknown value 'e4m3'"):
        resolve_fp8("e4m3")
    cfg = get_recipe("dit-tiny")
    cfg = dataclasses.replace(
        cfg,
        train=dataclasses.replace(cfg.train, fp8="on"),
        parallel=dataclasses.replace(cfg.parallel, tp=2),
    )
    with pytest.raises(ConfigError, match="train.fp8: 'on' cannot combine with parallel.tp=2"):
        validate(cfg)


@pytest.mark.parametrize("recipe", ["dit-tiny", "stdit-tiny", "llama-dit-tiny"])
def test_fp8_linears_are_block_gemms_without_adaln(recipe):
    model = build_model(get_recipe(recipe).model)
    names = fp8_linear_names(model)
    assert names, "no FP8 linear selected"
    assert all(n.startswith("blocks.") and "modulation" not in n for n in names)
    mods = dict(model.named_modules())
    assert all(mods[n].in_features % 16 == 0 and mods[n].out_features % 16 == 0 for n in names)
    # every attention projection and MLP GEMM of the first block is in (sizes allow it here)
    first = {n.split(".", 2)[2] for n in names if n.startswith("blocks.0.")}
    assert {"cross_attn.q", "cross_attn.o"} <= first
    assert any(n.startswith("self_attn.0.") for n in first)
    assert any(n.startswith("mlp.") for n in first)


def test_off_context_is_a_no_op_and_state_filter_keeps_tensors():
    with fp8_autocast(False):
        y = torch.ones(2) * 3
    assert y.tolist() == [3.0, 3.0]
    sd = {"blocks.0.mlp.fc1.weight": torch.ones(1), "blocks.0.mlp.fc1._extra_state": b"x"}
    assert list(drop_fp8_state(sd)) == ["blocks.0.mlp.fc1.weight"]


@cpu_only
def test_trainer_with_fp8_auto_trains_on_cpu_and_says_why(tmp_path):
    from vfm_core.train.trainer import Trainer

    cfg = get_recipe("dit-tiny")
    cfg = dataclasses.replace(
        cfg,
        train=dataclasses.replace(
            cfg.train, fp8="auto", steps=2, device="cpu", out_dir=str(tmp_path)
        ),
        tracking=dataclasses.replace(cfg.tracking, mlflow=False),
    )
    tr = Trainer(cfg)
    assert tr.fp8 is False and tr.fp8_reason == "off (no CUDA device)"
    out = tr.train_step(tr.source.next_batch())
    assert torch.isfinite(torch.tensor(out["loss"]))


@pytest.mark.gpu
def test_te_fp8_forward_tracks_bf16_on_gpu():
    require_fp8_backend("te")
    cfg = get_recipe("dit-tiny").model
    torch.manual_seed(0)
    ref = build_model(cfg, device="cuda")
    model = build_model(cfg, device="cuda")
    model.load_state_dict(ref.state_dict())
    assert to_te_linears(model) == len(fp8_linear_names(ref))
    x = torch.randn(2, cfg.in_channels, 4, 16, 16, device="cuda")
    c = torch.randn(2, device="cuda")
    text = torch.randn(2, cfg.text_len, cfg.text_dim, device="cuda")
    with torch.autocast("cuda", dtype=torch.bfloat16):
        want = ref(x, c, text)
        with fp8_autocast(True):
            got = model(x, c, text)
    rel = (got.float() - want.float()).norm() / want.float().norm().clamp_min(1e-6)
    assert rel < 0.1, rel
    assert set(drop_fp8_state(model.state_dict())) == set(ref.state_dict())
