"""Packing: FFD bins, the pack's token geometry, and the proof that packed attention (the sample
groups' mask through SDPA, per-token RoPE positions) equals running each sample alone, forward and
backward; the per-sample loss average. (Packs under ring / all-to-all context parallelism:
tests/parallel/test_packed_equivalence.py.)"""

from __future__ import annotations

import random

import pytest
import torch

from vfm_core.data.packing import first_fit_decreasing
from vfm_core.geometry import (
    PackLayout,
    attention_groups,
    cross_attention_mask,
    pack_tokens,
    per_sample_mean,
    rope_angles,
    unpack_tokens,
)
from vfm_core.models.layers import apply_rope, attention, rope_3d

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

    def attend(*args, **kw):  # through the kernel under test
        return attention(*args, **kw, backend=backend)

    # one by one: 3D RoPE of each sample's own grid, full attention, cross-attn to own text
    ref = []
    for x, g, txt in zip(xs, GRIDS, texts):
        ang = rope_3d(g, hd, theta)  # (n, hd/2)
        q, k = apply_rope(heads_(x @ wq), ang), apply_rope(heads_(x @ wk), ang)
        y = attend(q, k, heads_(x @ wv))  # (1, H, n, hd)
        y = y + attend(heads_(x @ wq), heads_(txt @ wk), heads_(txt @ wv))
        ref.append(y.transpose(1, 2).reshape(-1, dim))  # (n, D)
    # packed: one sequence, per-token positions, block-diagonal + own-text masks
    xp = pack_tokens(xs, lay)  # (64, D)
    ang = rope_angles(lay.positions, hd, theta)  # (64, hd/2)
    q, k = apply_rope(heads_(xp @ wq), ang), apply_rope(heads_(xp @ wk), ang)
    ids = attention_groups(lay, "full")  # the sample; each padding token its own group
    y = attend(q, k, heads_(xp @ wv), mask=(ids[:, None] == ids[None, :])[None, None])
    tl = torch.tensor([t.shape[0] for t in texts])  # (S,) own caption lengths
    tp = torch.zeros(len(texts), int(tl.max()), dim, dtype=torch.float64)
    for i, t in enumerate(texts):
        tp[i, : t.shape[0]] = t  # (S, Lmax, D) zero padded
    tflat = tp.reshape(-1, dim)  # (S*Lmax, D)
    cmask = cross_attention_mask(lay.sample_ids, tl)[None, None]  # (1, 1, 64, S*Lmax)
    y = y + attend(heads_(xp @ wq), heads_(tflat @ wk), heads_(tflat @ wv), mask=cmask)
    out = unpack_tokens(y.transpose(1, 2).reshape(-1, dim), lay)
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
    torch.manual_seed(1)
    err = [torch.rand(n, 6) for n in (4, 18, 18, 8)]  # squared errors per token and channel
    sd = 0.5
    weight = (sigma**2 + sd**2) / (sigma * sd) ** 2  # EDM loss weight per sample
    ref = torch.stack([weight[i] * e.mean() for i, e in enumerate(err)])  # per-sample losses
    w_tok = weight[lay.sample_ids.clamp(min=0)] * (lay.sample_ids >= 0)  # (64,)
    tok_loss = w_tok * pack_tokens(err, lay).mean(-1)  # (64,), padding contributes 0
    per = per_sample_mean(tok_loss, lay.sample_ids, lay.n_samples)
    torch.testing.assert_close(per, ref)
    # average over samples, not tokens: an 18-token video counts as much as a 4-token image
    assert per.mean() == pytest.approx(float(ref.mean()))
    assert float(tok_loss[:48].mean()) != pytest.approx(float(ref.mean()), rel=1e-3)
