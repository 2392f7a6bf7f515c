"""The analytic FLOP count of vfm_core.perf.flops against what autograd actually executes.

Reference: ``torch.utils.flop_counter.FlopCounterMode`` on a real forward (+ backward of
``out.square().mean()``); forward passes are broken down per module so every component is checked on
its own, not only the total. The CPU build's fused SDPA kernel
(``_scaled_dot_product_flash_attention_for_cpu``) has no FLOP formula registered in torch 2.13 (it
counts 0), so the model runs on a path whose matmuls are visible: the reference ``math`` backend, or
``sdpa`` restricted to ``SDPBackend.MATH``.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from vfm_core.config import ModelConfig
from vfm_core.families import build_model
from vfm_core.geometry import default_grid
from vfm_core.models.local_attention import set_attention_backend
from vfm_core.perf.flops import (
    COMPONENTS,
    forward_flops,
    param_count,
    train_flops,
    train_flops_per_token,
)
from vfm_core.recipes import get_recipe

TEXT_DIM, TEXT_LEN, CH = 48, 5, 4

ARCHS = {
    "dit": {},
    "stdit": {},
    "stdit-full2": {"arch": "stdit", "stdit_full_every": 2},  # block 1 uses full attention
    "llama_dit-gqa": {"arch": "llama_dit", "mlp": "swiglu", "norm": "rms", "kv_heads": 2},
    "dit-abs_pos": {"arch": "dit", "abs_pos": 12},  # position features into the patch embedding
    "dit-pooled": {"arch": "dit", "text_conditioning": "pooled"},  # no cross-attention
}
# (batch, latent (T, H, W), patch)
SHAPES = [
    (2, (4, 8, 8), (1, 2, 2)),  # grid (4, 4, 4)
    (1, (3, 6, 10), (1, 2, 2)),  # grid (3, 3, 5): non-square frame, odd t
    (3, (4, 4, 8), (2, 2, 2)),  # grid (2, 2, 4), temporal patch
]


def small_cfg(name: str, adaln: str, patch=(1, 2, 2)) -> ModelConfig:
    extra = dict(ARCHS[name])
    arch = extra.pop("arch", name)
    return ModelConfig(
        arch=arch,
        hidden=64,
        depth=2,
        heads=4,
        text_dim=TEXT_DIM,
        text_len=TEXT_LEN,
        in_channels=CH,
        patch=patch,
        adaln=adaln,
        adaln_lora_rank=16,
        freq_dim=32,
        **extra,
    )


@pytest.fixture(autouse=True)
def one_thread():
    """FLOP counts do not depend on threads; tiny GEMMs on a busy multi-core box run far faster
    on one thread than with a contended pool (25× here)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def component(module_name: str) -> str | None:
    """Map a FlopCounterMode module path (``DiT.blocks.0.cross_attn.k``) to a COMPONENTS key;
    None for container modules whose FLOPs are attributed to their children, "unmapped" for
    modules that are no matmul (norms)."""
    parts = module_name.split(".")[1:]
    if not parts:
        return None
    head = parts[0]
    if head == "x_embedder":
        return "patch_embed"
    if head == "t_embedder":
        return "timestep_embed" if len(parts) == 3 else None  # DiT.t_embedder.mlp.{0,2}
    if head == "text_embedder":
        return "text_embed" if len(parts) == 2 else None  # DiT.text_embedder.proj
    if head == "adaln_global":
        return "adaln" if len(parts) == 2 else None
    if head == "final":
        return {"modulation": "adaln", "linear": "final"}.get(parts[1]) if len(parts) == 2 else None
    if head == "blocks":
        rest = parts[2:]
        if not rest or "core" in rest:  # an attention core: counted with its attention module
            return None
        if rest[0] == "modulation":
            return "adaln" if len(rest) == 3 or (len(rest) == 2 and rest[1] == "proj") else None
        if rest[0] == "mlp":
            return "mlp" if len(rest) == 2 else None
        if rest[0] == "self_attn":
            return "qkvo" if len(rest) == 3 else ("attention" if len(rest) == 2 else None)
        if rest[0] == "cross_attn":
            if len(rest) == 1:
                return "cross_attention"
            return "cross_kv" if rest[1] in ("k", "v") else "cross_qo"
    return "unmapped"  # norms, activations: must count 0 (checked in measure)


def measure(
    cfg: ModelConfig,
    batch: int,
    latent: tuple[int, int, int],
    *,
    train: bool,
    seed: int = 0,
    input_grads: tuple[str, ...] = (),
    backend: str = "math",
) -> dict[str, float]:
    """FlopCounterMode count of one forward (+ backward) of the real model, its attention
    through the kernel ``backend`` (default the reference: every FLOP a matmul).

    Forward only: broken down by component through the module tree. With backward only "total":
    FlopCounterMode attributes backward ops to modules through backward hooks, which lands some of
    them on a neighbouring module (e.g. a norm), so a per-module split would not be meaningful.
    ``input_grads`` names inputs ("x", "text", "c_noise") that should require gradients.
    """
    torch.manual_seed(seed)
    model = set_attention_backend(build_model(cfg), backend)
    inputs = {
        "x": torch.randn(batch, cfg.in_channels, *latent),
        "c_noise": torch.randn(batch),
        "text": torch.randn(batch, cfg.text_len, cfg.text_dim),
    }
    for name in input_grads:
        inputs[name].requires_grad_(True)
    counter = FlopCounterMode(display=False)
    with counter:
        out = model(inputs["x"], inputs["c_noise"], inputs["text"])
        if train:
            out.square().mean().backward()
    total = float(counter.get_total_flops())
    if train:
        return {"total": total}
    per_module = {name: float(sum(ops.values())) for name, ops in counter.get_flop_counts().items()}
    result = dict.fromkeys(COMPONENTS, 0.0)
    for name, flops in per_module.items():
        kind = component(name) if name.startswith("DiT.") else None
        if kind in ("attention", "cross_attention"):
            # an attention module's own work = its total minus its q/k/v/o projections
            flops -= sum(per_module.get(f"{name}.{p}", 0.0) for p in ("q", "k", "v", "o"))
        if kind == "unmapped":
            assert flops == 0, f"{name} counts {flops} FLOPs but maps to no component"
        elif kind is not None:
            result[kind] += flops
    result["total"] = total
    assert math.isclose(sum(result[c] for c in COMPONENTS), total, rel_tol=1e-12), (
        "some counted FLOPs are outside the mapped modules"
    )
    return result


def grid_of(latent, patch):
    return tuple(s // p for s, p in zip(latent, patch, strict=True))


def rel(a: float, b: float) -> float:
    return abs(a - b) / max(abs(b), 1.0)


@pytest.mark.parametrize("adaln", ["zero", "lora"])
@pytest.mark.parametrize("arch", list(ARCHS))
@pytest.mark.parametrize("batch,latent,patch", SHAPES)
def test_train_flops_match_flop_counter(arch, adaln, batch, latent, patch):
    cfg = small_cfg(arch, adaln, patch)
    grid = grid_of(latent, patch)
    n = math.prod(grid)
    measured = measure(cfg, batch, latent, train=True)
    analytic = train_flops(cfg, seq_lens=n, grid=grid, batch=batch)
    per_token = train_flops_per_token(cfg, seq_len=n, grid=grid)
    assert rel(per_token * n * batch, measured["total"]) < 0.02  # the brief's bound ...
    assert rel(analytic["total"], measured["total"]) < 1e-9  # ... the count is in fact exact


@pytest.mark.parametrize("adaln", ["zero", "lora"])
@pytest.mark.parametrize("arch", list(ARCHS))
def test_forward_flops_match_flop_counter(arch, adaln):
    batch, latent, patch = SHAPES[0]
    cfg = small_cfg(arch, adaln, patch)
    grid = grid_of(latent, patch)
    measured = measure(cfg, batch, latent, train=False)
    analytic = forward_flops(cfg, seq_lens=math.prod(grid), grid=grid, batch=batch)
    for c in (*COMPONENTS, "total"):
        assert rel(analytic[c], measured[c]) < 1e-9, (c, analytic[c], measured[c])


@pytest.mark.parametrize("arch", ["dit", "llama_dit-gqa"])
def test_sdpa_math_kernel_counts_the_same(arch):
    """The production ``sdpa`` path (GQA via enable_gqa) restricted to the math kernel."""
    batch, latent, patch = SHAPES[1]
    cfg = small_cfg(arch, "lora", patch)
    grid = grid_of(latent, patch)
    with sdpa_kernel(SDPBackend.MATH):
        measured = measure(cfg, batch, latent, train=True, backend="sdpa")
    analytic = train_flops(cfg, seq_lens=math.prod(grid), grid=grid, batch=batch)
    assert rel(analytic["total"], measured["total"]) < 1e-9
    with sdpa_kernel(SDPBackend.MATH):
        measured = measure(cfg, batch, latent, train=False, backend="sdpa")
    analytic = forward_flops(cfg, seq_lens=math.prod(grid), grid=grid, batch=batch)
    assert rel(analytic["attention"], measured["attention"]) < 1e-9


def test_packed_attention_is_sum_of_squares():
    """Packed samples (block-diagonal mask) cost what the samples cost one by one: Σ Sᵢ², not
    (Σ Sᵢ)². Measured by running every sample as its own forward+backward."""
    cfg = small_cfg("stdit-full2", "lora")
    grids = [(2, 4, 4), (3, 2, 6), (1, 4, 2)]
    lens = [math.prod(g) for g in grids]
    measured = sum(measure(cfg, 1, (t, 2 * h, 2 * w), train=True)["total"] for t, h, w in grids)
    packed = train_flops(cfg, seq_lens=lens, grid=grids)
    assert rel(packed["total"], measured) < 1e-9

    dit = small_cfg("dit", "lora")
    lens = [64, 16, 48]
    as_packed = forward_flops(dit, seq_lens=lens)
    as_one = forward_flops(dit, seq_lens=sum(lens))
    assert as_packed["attention"] < as_one["attention"]
    assert math.isclose(
        as_packed["attention"] / as_one["attention"],
        sum(s * s for s in lens) / sum(lens) ** 2,
    )
    for c in ("qkvo", "cross_qo", "cross_attention", "mlp", "patch_embed", "final"):
        assert math.isclose(as_packed[c], as_one[c])  # token-linear terms: Σ Sᵢ either way
    for c in ("adaln", "timestep_embed", "cross_kv"):
        assert math.isclose(as_packed[c], 3 * as_one[c])  # per-sample terms: 3 samples vs 1


@pytest.mark.parametrize("adaln", ["zero", "lora"])
def test_per_sample_terms_do_not_scale_with_tokens(adaln):
    cfg = small_cfg("dit", adaln)
    small = measure(cfg, 2, (2, 4, 4), train=False)  # 8 tokens per sample
    large = measure(cfg, 2, (4, 8, 8), train=False)  # 64 tokens per sample
    tripled = measure(cfg, 6, (2, 4, 4), train=False)
    for c in ("adaln", "timestep_embed", "cross_kv"):
        assert small[c] == large[c] > 0
        assert math.isclose(tripled[c], 3 * small[c])
    assert math.isclose(large["mlp"], 8 * small["mlp"])
    # golden value by hand, per sample, D = 64, depth 2, 3 sub-layers per block, final mod D -> 2D:
    d = 64
    if adaln == "zero":  # per block D -> 3·3D
        golden = 2 * (2 * d * 9 * d) + 2 * d * 2 * d
    else:  # global D -> 3D once; per block and sub-layer D -> r -> 3D with r = 16
        golden = 2 * d * 3 * d + 2 * 3 * (2 * d * 16 + 2 * 16 * 3 * d) + 2 * d * 2 * d
    assert forward_flops(cfg, seq_lens=8)["adaln"] == golden
    assert forward_flops(cfg, seq_lens=4096)["adaln"] == golden
    assert forward_flops(cfg, seq_lens=8, batch=5)["adaln"] == 5 * golden


def test_stdit_attention_spatial_and_temporal():
    cfg = small_cfg("stdit", "zero")
    t, h, w = 4, 6, 10
    att = forward_flops(cfg, seq_lens=t * h * w, grid=(t, h, w))["attention"]
    assert att == cfg.depth * 4 * cfg.hidden * (t * (h * w) ** 2 + (h * w) * t**2)
    full = forward_flops(small_cfg("dit", "zero"), seq_lens=t * h * w)["attention"]
    assert att < full  # factorised attention is cheaper than full 3D attention
    # every 2nd block full: block 0 spatial+temporal, block 1 full
    mixed = forward_flops(small_cfg("stdit-full2", "zero"), seq_lens=t * h * w, grid=(t, h, w))
    assert mixed["attention"] == att / 2 + full / 2
    with pytest.raises(ValueError, match="tokens"):
        forward_flops(cfg, seq_lens=100, grid=(t, h, w))


def _per_token_weights(model: torch.nn.Module) -> int:
    """Weights of the matmuls applied to every video token, read off the real module tree: all
    linear weights except the per-sample conditioning path (timestep MLP, AdaLN) and the
    cross-attention k/v projections (applied to text tokens). Norm weights and biases are
    element-wise, not matmul work."""
    skip = ("t_embedder.", "adaln_global.", "modulation.", "cross_attn.k.", "cross_attn.v.")
    total = 0
    for name, mod in model.named_modules():
        if isinstance(mod, torch.nn.Linear) and not any(s in name + "." for s in skip):
            total += mod.weight.numel()
    return total


@pytest.mark.parametrize("recipe", ["dit-7b", "llama-dit-7b", "stdit-7b"])
def test_paper_scale_count_is_plausible(recipe):
    """6·P per token for the weights every token passes through (Kaplan et al. 2020) plus PaLM's
    12·depth·S·D attention term, with P read from the real (meta-device) module tree."""
    cfg = get_recipe(recipe)
    m = cfg.model
    grid = (cfg.data.latent_frames, cfg.data.latent_height // 2, cfg.data.latent_width // 2)
    n = math.prod(grid)
    assert n == 56_320
    model = build_model(m, device="meta")
    p_tok = _per_token_weights(model)
    tr = train_flops(m, seq_lens=n, grid=grid)

    attention_part = tr["attention"] + tr["cross_attention"]
    per_sample = tr["adaln"] + tr["timestep_embed"] + tr["cross_kv"]
    weight_part = tr["total"] - attention_part - per_sample
    # only deviation from 6·P: the patch embedding has no input gradient (4·P instead of 6·P)
    assert rel(weight_part, 6 * p_tok * n) < 1e-3

    d = m.heads * m.head_dim
    if m.arch == "stdit":  # spatial span h·w and temporal span t per block
        span = grid[1] * grid[2] + grid[0]
    else:
        span = n
    assert rel(tr["attention"] / n, 12 * m.depth * d * span) < 1e-12
    assert rel(tr["cross_attention"] / n, 12 * m.depth * d * m.text_len) < 1e-12
    assert per_sample / tr["total"] < 1e-3  # amortised over 56k tokens: negligible

    # the naive 6·(all params) overcounts: AdaLN-LoRA, timestep MLP and the text k/v projections
    # (≈9% of a 7B DiT's parameters) run once per sample, not once per video token
    params = param_count(m)
    assert params == sum(p.numel() for p in model.parameters())
    assert 1.03 < params / p_tok < 1.2
    per_token = train_flops_per_token(m, seq_len=n, grid=grid)
    assert 1e11 < per_token < 1e12 if m.arch != "stdit" else 4e10 < per_token < 1e11


def test_default_grid():
    assert default_grid(56_320) == (16, 55, 64)  # same t and frame size as the real (16, 44, 80)
    for n in (1, 7, 64, 256, 1000, 4096, 56_320):
        t, h, w = default_grid(n)
        assert t * h * w == n and h <= w
    with pytest.raises(ValueError):
        default_grid(0)
    # ST-DiT without a grid falls back to default_grid
    cfg = small_cfg("stdit", "lora")
    assert forward_flops(cfg, seq_lens=256) == forward_flops(
        cfg, seq_lens=256, grid=default_grid(256)
    )


def test_backward_rule_for_leaf_inputs():
    """patch embed, cross-attn k/v (text) and the first timestep layer: forward + dW only (2×).
    Measured: making such an input require grad adds exactly one more forward's worth (its dX)."""
    cfg = small_cfg("llama_dit-gqa", "lora")
    batch, latent = 2, (2, 8, 8)
    n = 2 * 4 * 4
    fwd = forward_flops(cfg, seq_lens=n, batch=batch)
    tr = train_flops(cfg, seq_lens=n, batch=batch)
    assert tr["patch_embed"] == 2 * fwd["patch_embed"]
    assert tr["cross_kv"] == 2 * fwd["cross_kv"]
    for c in ("qkvo", "attention", "cross_qo", "cross_attention", "mlp", "adaln", "final"):
        assert tr[c] == 3 * fwd[c]
    first = 2 * batch * cfg.freq_dim * cfg.hidden  # timestep MLP layer 1: 2·B·F·D
    assert tr["timestep_embed"] == 3 * fwd["timestep_embed"] - first

    base = measure(cfg, batch, latent, train=True)["total"]
    assert rel(base, tr["total"]) < 1e-9
    with_text = measure(cfg, batch, latent, train=True, input_grads=("text",))["total"]
    assert rel(with_text - base, fwd["cross_kv"]) < 1e-9
    with_x = measure(cfg, batch, latent, train=True, input_grads=("x",))["total"]
    assert rel(with_x - base, fwd["patch_embed"]) < 1e-9

    with pytest.raises(ValueError):
        train_flops(cfg, seq_lens=[])
    with pytest.raises(ValueError):
        train_flops(cfg, seq_lens=64, batch=0)
