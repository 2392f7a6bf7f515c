"""The causal video transformer: causal (no future token changes a logit), KV-cached decoding equals
the full forward, bad token ids are named."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from vfm_core.config import ModelConfig
from vfm_core.geometry import ShapeError
from vfm_core.models.ar import CausalVideoTransformer, next_token_loss

CFG = ModelConfig(
    arch="ar", vocab_size=50, hidden=64, depth=2, heads=4, kv_heads=2, text_dim=16, text_len=3
)


@pytest.fixture(scope="module", params=["cross", "pooled", "fused", "absolute"])
def model(request):
    """The model with cross-attention to the caption, with its pooled mean instead, with
    cross-attention, SwiGLU and the fused q/k/v projection, and at nanoGPT's configuration
    (absolute positions only, no RoPE; LayerNorm, exact-GELU MLP, pooled caption)."""
    torch.manual_seed(0)
    over = {
        "pooled": dict(text_conditioning="pooled"),
        "fused": dict(fused_proj=True, mlp="swiglu"),
        "absolute": dict(
            rope=False,
            abs_pos=6,
            qk_norm=False,
            norm="layer",
            mlp="gelu_exact",
            mlp_bias=False,
            text_conditioning="pooled",
        ),
    }
    cfg = dataclasses.replace(CFG, **over.get(request.param, {}))
    return CausalVideoTransformer(cfg).double().eval()


def _inputs(b=2, grid=(2, 3, 4), seed=1):
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, CFG.vocab_size, (b, *grid), generator=g)
    text = torch.randn(b, CFG.text_len, CFG.text_dim, generator=g, dtype=torch.float64)
    return tokens, text


def test_logits_are_causal(model):
    tokens, text = _inputs()
    logits = model(tokens, text)  # (B, N, V)
    assert logits.shape == (2, 24, CFG.vocab_size)
    changed = tokens.clone().flatten(1)
    changed[:, 10] = (changed[:, 10] + 1) % CFG.vocab_size
    logits2 = model(changed.view_as(tokens), text)
    # logits[:, i] sees tokens < i: positions <= 10 are unchanged, position 11 on may change
    assert torch.allclose(logits[:, :11], logits2[:, :11], atol=1e-12)
    assert not torch.allclose(logits[:, 11:], logits2[:, 11:])


def test_kv_cache_decoding_equals_full_forward(model):
    tokens, text = _inputs()
    full = model(tokens, text)  # (B, N, V)
    ids = tokens.flatten(1)
    inputs = model.shift_right(ids)
    rope = model.rope(tuple(tokens.shape[1:]))
    caches = model.new_caches(ids.shape[1])
    # prefill 7 positions at once, then one position per call
    parts = [model.forward_ids(inputs[:, :7], text, rope[:7], caches=caches)]
    for i in range(7, ids.shape[1]):
        parts.append(model.forward_ids(inputs[:, i : i + 1], text, rope[i : i + 1], caches=caches))
    assert torch.allclose(torch.cat(parts, dim=1), full, atol=1e-10)


def test_loss_falls_and_bad_ids_are_named():
    torch.manual_seed(0)
    m = CausalVideoTransformer(CFG)
    tokens, text = _inputs()
    text = text.float()
    opt = torch.optim.AdamW(m.parameters(), lr=3e-3)
    losses = []
    for _ in range(30):
        loss = next_token_loss(m(tokens, text), tokens.flatten(1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[0] == pytest.approx(torch.log(torch.tensor(50.0)).item(), rel=0.1)
    assert losses[-1] < 0.5 * losses[0]
    with pytest.raises(ShapeError, match=r"\[0, 50\)"):
        m(torch.full((1, 1, 2, 2), 50), text[:1])
    with pytest.raises(ShapeError, match=r"\[0, 50\) \(model.vocab_size\), got min -1 max 50"):
        m(torch.tensor([[[[-1, 3], [50, 7]]]]), text[:1])
    with pytest.raises(ShapeError, match="integer"):
        m(torch.zeros(1, 1, 2, 2), text[:1])


def test_packed_forward_equals_each_sample_alone(model):
    from vfm_core.geometry import PackLayout
    from vfm_core.models.ar import packed_next_token_loss

    grids = [(2, 3, 4), (1, 2, 2), (3, 2, 2)]
    g = torch.Generator().manual_seed(5)
    vids = [torch.randint(0, CFG.vocab_size, (1, *gr), generator=g) for gr in grids]
    lens = torch.tensor([3, 1, 2])
    text = torch.randn(3, CFG.text_len, CFG.text_dim, generator=g, dtype=torch.float64)
    layout = PackLayout.from_grids(grids, length=48)  # 24 + 4 + 12 tokens, 8 padding
    ids = torch.zeros(48, dtype=torch.long)
    ids[:40] = torch.cat([v.flatten() for v in vids])
    logits = model.forward_packed(ids, text, lens, layout)  # (48, V)
    per_sample = packed_next_token_loss(logits, ids, layout)  # (3,)
    a = 0
    for i, v in enumerate(vids):
        alone = model(v, text[i : i + 1, : lens[i]])  # (1, n, V)
        n = v.numel()
        assert torch.allclose(logits[a : a + n], alone[0], atol=1e-10)
        assert torch.allclose(per_sample[i], next_token_loss(alone, v.flatten(1)), atol=1e-12)
        a += n
    assert torch.isfinite(logits[40:]).all()
