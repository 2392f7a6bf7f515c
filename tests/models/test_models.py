from __future__ import annotations

import pytest
import torch
from model_init import random_model

from vfm_core.config import apply_overrides
from vfm_core.families import build_model
from vfm_core.geometry import ShapeError, patchify, unpatchify
from vfm_core.models.attention import Attention
from vfm_core.models.attention_spec import AttentionSpec
from vfm_core.models.dit import DiTBlock, count_params
from vfm_core.models.layers import apply_rope, attention, rope_3d
from vfm_core.models.local_attention import LocalAttention, set_attention_backend
from vfm_core.recipes import get_recipe


def test_patchify_round_trip_and_order():
    x = torch.randn(2, 3, 4, 6, 8)
    tokens, grid = patchify(x, (2, 2, 2))
    assert tokens.shape == (2, 2 * 3 * 4, 3 * 8) and grid == (2, 3, 4)
    # token 0 is the (t<2, h<2, w<2) cube, channels outermost
    assert torch.equal(tokens[0, 0].reshape(3, 2, 2, 2), x[0, :, :2, :2, :2])
    assert torch.equal(unpatchify(tokens, grid, (2, 2, 2), 3), x)


def test_patchify_rejects_bad_shapes():
    with pytest.raises(ShapeError, match=r"\(T, H, W\)=\(4, 5, 8\) is not divisible by the patch"):
        patchify(torch.randn(1, 3, 4, 5, 8), (1, 2, 2))
    with pytest.raises(ShapeError, match="must be \\(B, C, T, H, W\\)"):
        patchify(torch.randn(3, 4, 5, 8), (1, 2, 2))


def test_rope_scores_depend_on_relative_offsets_only():
    grid, d = (4, 4, 4), 24
    angles = rope_3d(grid, d, 10000.0)  # (64, 12)
    q = torch.randn(1, 1, 1, d).expand(1, 1, 64, d)
    k = torch.randn(1, 1, 1, d).expand(1, 1, 64, d)
    s = (apply_rope(q, angles) @ apply_rope(k, angles).transpose(-1, -2))[0, 0]  # (64, 64)

    def idx(t, h, w):
        return (t * 4 + h) * 4 + w

    for shift in [(1, 0, 0), (0, 1, 0), (0, 0, 1), (1, 2, 1)]:
        a, b = idx(0, 1, 0), idx(1, 0, 2)
        a2 = idx(0 + shift[0], 1 + shift[1], 0 + shift[2])
        b2 = idx(1 + shift[0], 0 + shift[1], 2 + shift[2])
        torch.testing.assert_close(s[a, b], s[a2, b2], rtol=1e-4, atol=1e-4)
    assert not torch.allclose(s[idx(0, 0, 0), idx(0, 0, 1)], s[idx(0, 0, 0), idx(0, 0, 3)])


def test_attention_without_rotary_ignores_the_angles():
    """model.rope=false: self-attention given RoPE angles computes what it does without them
    (the model's positions are then its absolute embedding's alone)."""
    torch.manual_seed(0)
    x = torch.randn(2, 12, 32, dtype=torch.float64)
    angles = rope_3d((1, 3, 4), 8, 10000.0).double()  # (12, 4)
    plain = Attention(32, 4, rotary=False).double()
    rotary = Attention(32, 4).double()
    rotary.load_state_dict(plain.state_dict())
    torch.testing.assert_close(plain(x, rope=angles), rotary(x), rtol=0, atol=0)
    assert not torch.allclose(rotary(x, rope=angles), rotary(x))


def test_layouts_equal_loops_over_groups():
    torch.manual_seed(0)
    attn = Attention(32, 4, kv_heads=2)
    grid = (3, 2, 4)
    x = torch.randn(2, 24, 32)
    rope = rope_3d(grid, 8, 10000.0)
    full = attn(x, spec=AttentionSpec(grid=grid, layout="full"), rope=rope)
    spatial = attn(x, spec=AttentionSpec(grid=grid, layout="spatial"), rope=rope)
    temporal = attn(x, spec=AttentionSpec(grid=grid, layout="temporal"), rope=rope)
    xs = x.reshape(2, 3, 8, 32)
    for t in range(3):  # spatial == full attention within each frame (rope's t part cancels)
        ref = attn(xs[:, t], rope=rope_3d((1, 2, 4), 8, 10000.0))
        torch.testing.assert_close(spatial.reshape(2, 3, 8, 32)[:, t], ref, rtol=1e-4, atol=1e-5)
    xt = x.reshape(2, 3, 8, 32)
    for j in range(8):  # temporal == full attention along t at each location
        hh, ww = divmod(j, 4)
        ang = rope.reshape(3, 2, 4, -1)[:, hh, ww]
        ref = attn(xt[:, :, j], rope=ang)
        torch.testing.assert_close(
            temporal.reshape(2, 3, 8, 32)[:, :, j], ref, rtol=1e-4, atol=1e-5
        )
    assert not torch.allclose(full, spatial)


def test_sdpa_and_math_backends_agree_with_gqa():
    q, k, v = torch.randn(2, 8, 10, 16), torch.randn(2, 2, 10, 16), torch.randn(2, 2, 10, 16)
    ref = attention(q, k, v)
    torch.testing.assert_close(attention(q, k, v, backend="math"), ref, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="unknown"):
        LocalAttention("flash9")


def test_the_attention_backend_belongs_to_the_model():
    """set_attention_backend sets the kernel of every core of one model and no other's (no
    process-global backend); the kernels agree."""
    cfg = get_recipe("stdit-tiny").model
    a, b = random_model(cfg, seed=1), random_model(cfg, seed=1)
    assert set_attention_backend(a, "math") is a
    kernels = [[m.backend for m in x.modules() if isinstance(m, LocalAttention)] for x in (a, b)]
    n_self = sum(len(blk.self_attn) for blk in a.blocks.values())
    assert kernels == [["math"] * (n_self + cfg.depth), ["sdpa"] * (n_self + cfg.depth)]
    x = torch.randn(2, cfg.in_channels, 4, 8, 8, dtype=torch.float64)
    c, text = torch.randn(2, dtype=torch.float64), torch.randn(2, cfg.text_len, cfg.text_dim)
    torch.testing.assert_close(a(x, c, text), b(x, c, text), rtol=1e-9, atol=1e-9)
    with pytest.raises(ValueError, match="unknown"):
        set_attention_backend(a, "flash9")


def test_qk_norm_is_per_head():
    attn = Attention(32, 4)
    q = attn.q(torch.randn(1, 5, 32)).view(1, 5, 4, 8)
    normed = attn.q_norm(q)
    torch.testing.assert_close(normed.pow(2).mean(-1), torch.ones(1, 5, 4), rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("recipe", ["dit-tiny", "stdit-tiny", "llama-dit-tiny"])
@pytest.mark.parametrize("adaln", ["zero", "lora"])
def test_blocks_start_as_identity_and_model_outputs_zero(recipe, adaln):
    cfg = apply_overrides(get_recipe(recipe), [f"model.adaln={adaln}"]).model
    torch.manual_seed(0)
    model = build_model(cfg)
    x = torch.randn(2, cfg.in_channels, 4, 8, 8)
    text = torch.randn(2, cfg.text_len, cfg.text_dim)
    out = model(x, torch.randn(2), text)
    assert out.shape == x.shape and torch.count_nonzero(out) == 0  # zero-initialised output
    block = model.blocks["0"]
    h = torch.randn(2, 64, cfg.hidden)
    emb = torch.randn(2, cfg.hidden)
    shared = torch.randn(2, 3 * cfg.hidden) * 0 if adaln == "lora" else None
    rope = rope_3d((4, 4, 4), cfg.head_dim, cfg.rope_theta)
    assert torch.equal(block(h, emb, shared, text, rope, spec=AttentionSpec(grid=(4, 4, 4))), h)


def test_training_moves_output_and_all_parts_get_gradients():
    cfg = get_recipe("stdit-tiny").model
    torch.manual_seed(0)
    model = build_model(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    x, t, text = torch.randn(2, 4, 4, 8, 8), torch.randn(2), torch.randn(2, 8, 384)
    for _ in range(3):
        loss = (model(x, t, text) - x).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
    loss = (model(x, t, text) - x).square().mean()
    loss.backward()
    missing = [n for n, p in model.named_parameters() if p.grad is None or p.grad.abs().sum() == 0]
    assert missing == []


def test_adaln_lora_is_smaller_than_zero():
    base = get_recipe("dit-7b")
    lora = count_params(build_model(base.model, device="meta"))
    zero = count_params(
        build_model(apply_overrides(base, ["model.adaln=zero"]).model, device="meta")
    )
    d, depth = 4096, 28
    # AdaLN-Zero adds 3 sub-layers x (D x 3D + 3D) per block; LoRA replaces that by rank-256 terms
    assert zero - lora == pytest.approx(
        depth * 3 * (3 * d * d + 3 * d - 256 * 4 * d) - 3 * d * d - 3 * d, rel=1e-6
    )
    assert 6.8e9 < lora < 7.6e9


def test_big_presets_build_on_meta():
    for name, lo, hi in [
        ("dit-28b", 26e9, 29e9),
        ("stdit-12b", 11e9, 13e9),
        ("llama-dit-7b", 6.5e9, 8e9),
    ]:
        model = build_model(get_recipe(name).model, device="meta")
        assert all(p.is_meta for p in model.parameters())
        assert lo < count_params(model) < hi, name


def test_llama_variant_uses_gqa_rmsnorm_swiglu():
    model = build_model(get_recipe("llama-dit-tiny").model)
    block = model.blocks["0"]
    assert isinstance(block.norms[0], torch.nn.RMSNorm)
    assert block.self_attn[0].k.out_features == 2 * 64  # 2 kv heads x head_dim 64
    assert hasattr(block.mlp, "w3")


def test_dit_block_layouts():
    cfg = apply_overrides(get_recipe("stdit-tiny"), ["model.stdit_full_every=2"]).model
    model = build_model(cfg)
    assert [b.layouts for b in model.blocks.values()] == [
        ("spatial", "temporal"),
        ("full",),
        ("spatial", "temporal"),
        ("full",),
    ]
    assert isinstance(model.blocks["1"], DiTBlock)
