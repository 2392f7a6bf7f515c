"""FP8 adapter: the selection and its fallback on CPU; FP8 layouts built on the meta device like
the bf16 ones (sharded shapes under a fake world of N ranks, the same initial weights, a trainer
step on CPU through the torch-native backend); the TE conversion and FP8 step on a GPU."""

from __future__ import annotations

import dataclasses
import functools
import sys
import types

import pytest
import torch
import torch.distributed as dist
from fp8_gpu import require_fp8_backend
from torch import nn
from torch.distributed.tensor import DTensor
from torch.distributed.tensor._utils import compute_local_shape_and_global_offset  # noqa: PLC2701

from vfm_core.config import ConfigError, apply_overrides, validate
from vfm_core.families import build_model
from vfm_core.models import fp8 as fp8_mod
from vfm_core.models.fp8 import (
    drop_fp8_state,
    fp8_autocast,
    fp8_linear_names,
    fp8_status,
    resolve_fp8,
    to_fp8_linears,
    to_te_linears,
)
from vfm_core.models.fp8_torch import Float8Linear
from vfm_core.models.init import init_parameters
from vfm_core.parallel.apply import apply_layout, build_parts
from vfm_core.parallel.layout import validate_layout
from vfm_core.perf.memory_check import fake_world
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


# ------------------------------------------------------------ FP8 built on the meta device

TORCH_FP8 = ("torch", "torch-native FP8 (a pretend Hopper without transformer-engine)")
"""What :func:`fp8_mod._fp8_select` answers on a GPU with ``torch._scaled_mm`` and no TE."""


@pytest.fixture
def no_process_group():
    """No default process group, so a fake world of N ranks can be made: the world of one rank
    that a trainer test of this session left is closed (a trainer makes a new one when needed)."""
    if dist.is_initialized():
        assert dist.get_world_size() == 1, "a multi-rank process group is still open"
        dist.destroy_process_group()
    yield


def layout(**parallel: object):
    return apply_overrides(
        get_recipe("dit-tiny"), [f"parallel.{k}={v}" for k, v in parallel.items()]
    )


def local(p: torch.Tensor) -> torch.Tensor:
    return p.to_local() if isinstance(p, DTensor) else p


def rank_parts(cfg, world: int, rank: int, prepare) -> dict:
    """Rank ``rank`` of ``world`` (fake process group): its parts built on meta (module classes,
    parameters' local shapes, all meta?), then materialised on CPU and initialised (local values,
    and the one-process model's values at the same place)."""
    seed = cfg.train.seed
    full = dict(build_model(cfg.model, seed=seed).named_parameters())
    with fake_world(rank, world):
        dims = validate_layout(cfg, world)
        dims.build_mesh("cpu")
        parts = build_parts(cfg, dims, device="meta", prepare=prepare)
        params = [(n, p) for part in parts for n, p in part.named_parameters()]
        out = {
            "classes": {n: type(m) for part in parts for n, m in part.named_modules()},
            "shapes": {n: tuple(local(p).shape) for n, p in params},
            "full": {n: tuple(p.shape) for n, p in params},
            "meta": all(p.is_meta for _, p in params),
            "fsdp": (dims.fsdp_mesh().size(), dims.fsdp_mesh().get_local_rank()),
            "sharded": all(isinstance(p, DTensor) for _, p in params),
            "values": {},
            "want": {},
        }
        for part in parts:
            part.to_empty(device="cpu")
            init_parameters(part, part.init_rule, seed=seed)
        for n, p in params:
            out["values"][n] = local(p).detach().clone()
            shape, offset = compute_local_shape_and_global_offset(
                p.shape, p.device_mesh, p.placements
            )
            box = tuple(slice(o, o + s) for o, s in zip(offset, shape, strict=True))
            out["want"][n] = full[n].detach()[box]
    return out


@pytest.mark.parametrize(
    ("world", "rank", "parallel"),
    [
        (4, 1, {"dp_shard": 4}),
        (4, 3, {"dp_shard": 2, "pp": 2}),
        (4, 2, {"dp_shard": 2, "cp": 2}),
    ],
    ids=["fsdp4", "pp2-fsdp2", "cp2-fsdp2"],
)
def test_fp8_layout_builds_on_meta_in_shards_and_initialises_like_bf16(
    no_process_group, world, rank, parallel
):
    """The torch-native FP8 conversion on the meta model: FP8 linears whose parameters are the
    same meta FSDP shards as the bf16 layout's (so ``vfm plan --check`` measures the same
    states), then every rank draws its shards of the one-process initialisation."""
    cfg = layout(**parallel)
    names = set(fp8_linear_names(build_model(cfg.model, device="meta")))
    fp8 = rank_parts(cfg, world, rank, functools.partial(to_fp8_linears, backend="torch"))
    plain = rank_parts(cfg, world, rank, None)
    assert fp8["meta"] and fp8["sharded"]
    here = names & set(fp8["classes"])  # this rank's stage holds some of the blocks
    assert here and all(fp8["classes"][n] is Float8Linear for n in here)
    assert all(plain["classes"][n] is nn.Linear for n in here)
    assert {n for n, c in fp8["classes"].items() if c is Float8Linear} == here
    assert fp8["shapes"] == plain["shapes"]  # same names, same local shard shapes
    shards, coord = fp8["fsdp"]  # FSDP2 keeps torch.chunk's piece ``coord`` of dim 0
    assert shards == world // parallel.get("pp", 1)
    for n, (rows, *rest) in fp8["full"].items():
        pieces = torch.arange(rows).chunk(shards)
        assert fp8["shapes"][n] == (len(pieces[coord]) if coord < len(pieces) else 0, *rest), n
    for n, v in fp8["values"].items():
        assert torch.equal(v, plain["values"][n]), n
        assert torch.equal(v, fp8["want"][n].to(v.dtype)), n


def test_apply_layout_converts_the_meta_model_and_never_builds_it_whole(
    no_process_group, monkeypatch
):
    """``apply_layout(fp8=True)`` on a pretend Hopper without TE (torch-native backend), 2 FSDP
    ranks: the conversion sees only meta parameters, and the rank ends with its shards of the
    same weights as ``fp8=False``."""
    monkeypatch.setattr(fp8_mod, "_fp8_select", lambda: TORCH_FP8)
    seen = []

    def converting(model: nn.Module) -> int:
        seen.append([p.is_meta for p in model.parameters()])
        return to_fp8_linears(model)

    monkeypatch.setattr(fp8_mod, "to_fp8_linears", converting)
    cfg = layout(dp_shard=2)
    state = {}
    for fp8 in (True, False):
        with fake_world(1, 2):
            dims = validate_layout(cfg, 2)
            dims.build_mesh("cpu")
            model = apply_layout(cfg, dims, device=torch.device("cpu"), fp8=fp8).parts[0]
            kinds = {type(m) for m in model.modules()}
            state[fp8] = {n: local(p).detach().clone() for n, p in model.named_parameters()}
        assert (Float8Linear in kinds) is fp8
    assert len(seen) == 1 and seen[0] and all(seen[0])
    assert list(state[True]) == list(state[False])
    assert all(torch.equal(state[True][n], state[False][n]) for n in state[False])


@pytest.mark.skipif(torch.cuda.is_available(), reason="pretends a GPU on CPU")
def test_trainer_builds_fp8_on_meta_and_steps_on_cpu(tmp_path, monkeypatch):
    """The trainer with ``train.fp8=on`` where the torch-native backend is selected: its model
    (one rank, FSDP2 over a real gloo group) has the FP8 linears, starts from the one-process
    initialisation, and trains a step (``torch._scaled_mm`` runs on CPU)."""
    from vfm_core.train.trainer import Trainer

    monkeypatch.setattr(fp8_mod, "_fp8_select", lambda: TORCH_FP8)
    cfg = apply_overrides(
        get_recipe("dit-tiny"),
        ["train.fp8=on", "train.steps=2", "train.device=cpu", f"train.out_dir={tmp_path}"],
    )
    cfg = dataclasses.replace(cfg, tracking=dataclasses.replace(cfg.tracking, mlflow=False))
    tr = Trainer(cfg)
    assert tr.fp8 is True and tr.fp8_reason == TORCH_FP8[1]
    mods = dict(tr.model.named_modules())
    names = fp8_linear_names(build_model(cfg.model, device="meta"))
    assert all(type(mods[n]) is Float8Linear for n in names)
    ref = dict(build_model(cfg.model, seed=cfg.train.seed).named_parameters())
    for n, p in tr.model.named_parameters():
        assert torch.equal(local(p).detach(), ref[n].detach()), n
    out = tr.train_step(tr.source.next_batch())
    assert torch.isfinite(torch.tensor(out["loss"]))


def test_te_conversion_of_a_meta_model_asks_te_for_meta_linears(monkeypatch):
    """The transformer-engine adapter on a meta model, with a stand-in for ``te.Linear`` (TE
    cannot be imported without CUDA): TE is asked for ``device="meta"`` modules (TE then defers
    its own initialisation) and nothing is copied; names stay."""
    made = []

    class StandInTELinear(nn.Linear):
        def __init__(self, in_features, out_features, bias=True, *, params_dtype, device):
            made.append(device)
            super().__init__(in_features, out_features, bias, device=device, dtype=params_dtype)

    te = types.ModuleType("transformer_engine.pytorch")
    te.Linear = StandInTELinear
    monkeypatch.setitem(sys.modules, "transformer_engine", types.ModuleType("transformer_engine"))
    monkeypatch.setattr(sys.modules["transformer_engine"], "pytorch", te, raising=False)
    monkeypatch.setitem(sys.modules, "transformer_engine.pytorch", te)
    monkeypatch.setattr(fp8_mod, "_fp8_select", lambda: ("te", "stand-in transformer-engine"))
    model = build_model(get_recipe("dit-tiny").model, device="meta")
    before = [n for n, _ in model.named_parameters()]
    assert to_fp8_linears(model) == len(made) == 40
    assert made == ["meta"] * 40
    assert [n for n, _ in model.named_parameters()] == before
    assert all(p.is_meta for p in model.parameters())
    assert sum(type(m) is StandInTELinear for m in model.modules()) == 40


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["te", "torch"])
def test_fp8_layout_on_cuda_starts_from_the_cpu_init_and_trains(backend):
    """This GPU's FP8 backend through ``apply_layout``: built on meta, materialised on the GPU,
    the weights equal the CPU one-process initialisation; a bf16 + FP8 forward and backward
    gives finite gradients everywhere."""
    from vfm_core.parallel.world import init_world

    require_fp8_backend(backend)
    device = torch.device("cuda")
    init_world(device)
    cfg = apply_overrides(
        get_recipe("dit-tiny"), ["train.dtype=bfloat16", "train.device=cuda", "data.batch_size=2"]
    )
    dims = validate_layout(cfg, 1)
    dims.build_mesh("cuda")
    model = apply_layout(cfg, dims, device=device, fp8=True).parts[0]
    mods = dict(model.named_modules())
    names = fp8_linear_names(build_model(cfg.model, device="meta"))
    assert all(type(mods[n]) is not nn.Linear for n in names)  # te.Linear or Float8Linear
    ref = dict(build_model(cfg.model, seed=cfg.train.seed).named_parameters())
    for n, p in model.named_parameters():
        assert p.device.type == "cuda"
        assert torch.equal(local(p).detach().cpu(), ref[n].detach()), n
    m = cfg.model
    x = torch.randn(2, m.in_channels, 4, 16, 16, device=device)  # (B, C, T, H, W)
    c = torch.rand(2, device=device)  # (B,)
    text = torch.randn(2, m.text_len, m.text_dim, device=device)  # (B, L, Dt)
    with torch.autocast("cuda", dtype=torch.bfloat16), fp8_autocast(True):
        out = model(x, c, text)  # (B, C, T, H, W)
    (out.float() - x).square().mean().backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())
