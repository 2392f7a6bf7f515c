"""Packing: FFD bins, layout, and the proof that packed attention (block-diagonal mask through
SDPA, per-token RoPE positions) equals running each sample alone, forward and backward; per-sample
sigma and the per-sample loss average."""

from __future__ import annotations

import random

import pytest
import torch

from vfm_core.data.packing import (
    PackLayout,
    attention_lse,
    block_diagonal_mask,
    cp_chunks,
    cross_attention_mask,
    expand_per_sample,
    first_fit_decreasing,
    merge_lse,
    pack_text,
    pack_tokens,
    per_sample_mean,
    rope_angles,
    unpack_tokens,
)
from vfm_core.models.layers import apply_rope, attention, rope_3d, set_attention_backend

GRIDS = [(1, 2, 2), (3, 2, 3), (2, 3, 3), (1, 4, 2)]  # an image, videos, a wide image


def test_first_fit_decreasing_respects_capacity_and_places_everything():
    rng = random.Random(0)
    lengths = [rng.randint(1, 100) for _ in range(200)]
    bins = first_fit_decreasing(lengths, 128)
    assert sorted(i for b in bins for i in b) == list(range(200))
    assert all(sum(lengths[i] for i in b) <= 128 for b in bins)
    assert len(bins) <= 1.25 * sum(lengths) / 128 + 1  # FFD is near the lower bound here
    assert bins == first_fit_decreasing(lengths, 128)  # deterministic
    with pytest.raises(ValueError, match="129 tokens > capacity 128"):
        first_fit_decreasing([3, 129], 128)


def test_layout_cu_seqlens_ids_positions():
    lay = PackLayout.from_grids(GRIDS, 64)
    assert lay.cu_seqlens.tolist() == [0, 4, 22, 40, 48]
    assert lay.n_tokens == 48 and lay.padding_fraction() == pytest.approx(16 / 64)
    assert (lay.sample_ids[40:48] == 3).all() and (lay.sample_ids[48:] == -1).all()
    assert lay.positions[4 + 7].tolist() == [1, 0, 1]  # sample 1 token 7 in raster (t, h, w)
    toks = [torch.randn(n, 5) for n in (4, 18, 18, 8)]
    back = unpack_tokens(pack_tokens(toks, lay), lay)
    assert all(torch.equal(a, b) for a, b in zip(toks, back))
    with pytest.raises(ValueError, match="does not fit"):
        PackLayout.from_grids(GRIDS, 40)


@pytest.mark.parametrize("backend", ["sdpa", "math"])
def test_packed_self_and_cross_attention_equal_per_sample(backend):
    torch.manual_seed(0)
    heads, hd, theta = 2, 24, 10000.0
    dim = heads * hd
    lay = PackLayout.from_grids(GRIDS, 64)
    xs = [
        torch.randn(lay_n, dim, dtype=torch.float64, requires_grad=True) for lay_n in (4, 18, 18, 8)
    ]
    texts = [torch.randn(n, dim, dtype=torch.float64) for n in (1, 3, 2, 5)]  # own lengths
    wq, wk, wv = (torch.randn(dim, dim, dtype=torch.float64) / dim**0.5 for _ in range(3))

    def heads_(t: torch.Tensor) -> torch.Tensor:  # (N, D) -> (1, H, N, hd)
        return t.view(1, -1, heads, hd).transpose(1, 2)

    set_attention_backend(backend)
    try:
        # one by one: 3D RoPE of each sample's own grid, full attention, cross-attn to own text
        ref = []
        for x, g, txt in zip(xs, GRIDS, texts):
            ang = rope_3d(g, hd, theta)  # (n, hd/2)
            q, k = apply_rope(heads_(x @ wq), ang), apply_rope(heads_(x @ wk), ang)
            y = attention(q, k, heads_(x @ wv))  # (1, H, n, hd)
            y = y + attention(heads_(x @ wq), heads_(txt @ wk), heads_(txt @ wv))
            ref.append(y.transpose(1, 2).reshape(-1, dim))  # (n, D)
        # packed: one sequence, per-token positions, block-diagonal + own-text masks
        xp = pack_tokens(xs, lay)  # (64, D)
        ang = rope_angles(lay.positions, hd, theta)  # (64, hd/2)
        q, k = apply_rope(heads_(xp @ wq), ang), apply_rope(heads_(xp @ wk), ang)
        y = attention(q, k, heads_(xp @ wv), mask=block_diagonal_mask(lay.sample_ids)[None, None])
        tp, tl = pack_text(texts)  # (S, Lmax, D), (S,)
        tflat = tp.reshape(-1, dim)  # (S*Lmax, D)
        cmask = cross_attention_mask(lay.sample_ids, tl)[None, None]  # (1, 1, 64, S*Lmax)
        y = y + attention(heads_(xp @ wq), heads_(tflat @ wk), heads_(tflat @ wv), mask=cmask)
        out = unpack_tokens(y.transpose(1, 2).reshape(-1, dim), lay)
    finally:
        set_attention_backend("sdpa")
    assert torch.isfinite(y).all()  # padding rows stay finite
    for a, b in zip(out, ref):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)
    # backward: the same gradient reaches every sample's input
    w = [torch.randn_like(r) for r in ref]
    g_ref = torch.autograd.grad(sum((r * wi).sum() for r, wi in zip(ref, w)), xs)
    g_pack = torch.autograd.grad(sum((o * wi).sum() for o, wi in zip(out, w)), xs)
    for a, b in zip(g_pack, g_ref):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)


def test_per_sample_sigma_and_loss_average():
    lay = PackLayout.from_grids(GRIDS, 64)
    sigma = torch.tensor([0.1, 2.0, 0.5, 8.0])  # one noise level per sample, not per pack
    s_tok = expand_per_sample(sigma, lay.sample_ids, fill=1.0)  # (64,)
    assert s_tok[:4].eq(0.1).all() and s_tok[40:48].eq(8.0).all() and s_tok[48:].eq(1.0).all()
    assert torch.equal(
        expand_per_sample(torch.log(sigma) / 4, lay.sample_ids)[4:22],
        torch.full((18,), float(torch.log(sigma[1]) / 4)),
    )
    torch.manual_seed(1)
    err = [torch.rand(n, 6) for n in (4, 18, 18, 8)]  # squared errors per token and channel
    sd = 0.5
    weight = (sigma**2 + sd**2) / (sigma * sd) ** 2  # EDM loss weight per sample
    ref = torch.stack([weight[i] * e.mean() for i, e in enumerate(err)])  # per-sample losses
    w_tok = expand_per_sample(weight, lay.sample_ids)  # (64,)
    tok_loss = w_tok * pack_tokens(err, lay).mean(-1)  # (64,), padding contributes 0
    per = per_sample_mean(tok_loss, lay.sample_ids, lay.n_samples)
    torch.testing.assert_close(per, ref)
    # average over samples, not tokens: an 18-token video counts as much as a 4-token image
    assert per.mean() == pytest.approx(float(ref.mean()))
    assert float(tok_loss[:48].mean()) != pytest.approx(float(ref.mean()), rel=1e-3)


def test_context_parallel_chunks_of_a_pack_equal_per_sample_attention():
    """Ring schedule over cp=4 contiguous chunks of one pack: each rank's queries visit every key
    chunk with its block of the block-diagonal mask; blocks where a row sees no key (a sample
    entirely on another rank) merge as nothing. Equal to attending sample by sample, fwd + bwd."""
    torch.manual_seed(3)
    lay = PackLayout.from_grids(GRIDS, 64)  # samples straddle chunk boundaries
    cp, heads, hd = 4, 2, 8
    xs = [
        torch.randn(1, heads, n, hd, dtype=torch.float64, requires_grad=True)
        for n in (4, 18, 18, 8)
    ]
    ref = [attention(x, x * 0.5, x.flip(-1)) for x in xs]  # per sample: q=x, k=x/2, v=flip(x)
    xp = torch.zeros(1, heads, 64, hd, dtype=torch.float64)
    xp = xp.index_copy(2, torch.arange(48), torch.cat(xs, 2))  # (1, H, 64, hd) packed
    q, k, v = xp, xp * 0.5, xp.flip(-1)
    mask = block_diagonal_mask(lay.sample_ids)  # (64, 64)
    chunks = cp_chunks(lay, cp)
    outs = []
    for i in range(cp):  # rank i
        out = lse = None
        for step in range(cp):  # k/v chunks arrive around the ring
            j = (i + step) % cp
            o, s_ = attention_lse(
                q[:, :, chunks[i]],
                k[:, :, chunks[j]],
                v[:, :, chunks[j]],
                mask[chunks[i], chunks[j]],
            )
            out, lse = (o, s_) if out is None else merge_lse(out, lse, o, s_)
        outs.append(out)
    packed = torch.cat(outs, 2)  # (1, H, 64, hd)
    assert torch.isfinite(packed).all()
    got = [packed[:, :, a:b] for a, b in zip(lay.cu_seqlens[:-1], lay.cu_seqlens[1:])]
    for a, b in zip(got, ref):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)
    w = [torch.randn_like(r) for r in ref]
    g_ref = torch.autograd.grad(sum((r * wi).sum() for r, wi in zip(ref, w)), xs)
    g_cp = torch.autograd.grad(sum((o * wi).sum() for o, wi in zip(got, w)), xs)
    for a, b in zip(g_cp, g_ref):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)
    with pytest.raises(ValueError, match="not divisible by cp=5"):
        cp_chunks(lay, 5)
