"""The fused-kernel pieces context-parallel attention is built from, on one process (fp64):

* :func:`flash_forward` blocks merged by log-sum-exp and :func:`flash_backward` given the merged
  output equal whole attention, forward and backward (what every ring step relies on);
* :func:`grouped_attention` equals attention under the (N, N) group mask — contiguous samples,
  strided ST-DiT groups, causal documents, grouped-query heads — and saves O(N), not N^2;
* :func:`block_rects` covers exactly the visible (query, key) pairs of any block.
"""

from __future__ import annotations

import pytest
import torch

from vfm_core.models.flash import (
    default_scale,
    flash_backward,
    flash_forward,
    grouped_attention,
)
from vfm_core.models.layers import attention
from vfm_core.parallel.ring import block_rects, causal_positions, merge_block
from vfm_core.perf.memory import measure_saved_bytes


def _qkvd(n: int, hq: int = 4, hkv: int = 2, d: int = 8, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(2, hq, n, d, generator=g, dtype=torch.float64)
    k = torch.randn(2, hkv, n, d, generator=g, dtype=torch.float64)
    v = torch.randn(2, hkv, n, d, generator=g, dtype=torch.float64)
    return q, k, v, torch.randn(2, hq, n, d, generator=g, dtype=torch.float64)


def _masked(q, k, v, mask):
    rep = q.shape[1] // k.shape[1]
    return attention(q, k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1), mask[None, None])


def test_blocks_merged_by_lse_equal_whole_attention_forward_and_backward():
    q, k, v, dout = _qkvd(24)
    ref_in = [t.clone().requires_grad_() for t in (q, k, v)]
    ref = _masked(*ref_in, torch.ones(24, 24, dtype=torch.bool))
    ref.backward(dout)
    scale = default_scale(q)
    out = torch.zeros_like(q)
    lse = torch.full(q.shape[:3], float("-inf"), dtype=q.dtype)
    blocks = [(0, 5), (5, 17), (17, 24)]
    for a, b in blocks:
        o, lo, _ = flash_forward(q, k[:, :, a:b], v[:, :, a:b], scale=scale)
        merge_block(out, lse, 0, 24, o, lo)
    assert (out - ref).abs().max() < 1e-12
    dq = torch.zeros_like(q)
    dk, dv = torch.zeros_like(k), torch.zeros_like(v)
    for a, b in blocks:
        gq, gk, gv = flash_backward(dout, q, k[:, :, a:b], v[:, :, a:b], out, lse, scale=scale)
        dq += gq
        dk[:, :, a:b] += gk
        dv[:, :, a:b] += gv
    for mine, theirs in zip((dq, dk, dv), ref_in, strict=True):
        assert (mine - theirs.grad).abs().max() < 1e-12


def _groups(kind: str) -> torch.Tensor:
    if kind == "samples":  # contiguous samples of 5, 11, 8 tokens
        return torch.tensor([0] * 5 + [1] * 11 + [2] * 8)
    if kind == "strided":  # ST-DiT temporal groups: (h, w) of a 4 x 6 grid, strided
        return torch.arange(24) % 6
    return torch.tensor([3] * 7 + [1] * 7 + [2] * 10)  # unequal lengths, ids out of order


@pytest.mark.parametrize("kind", ["samples", "strided", "mixed"])
@pytest.mark.parametrize("causal", [False, True])
def test_grouped_attention_equals_the_group_mask(kind, causal):
    ids = _groups(kind)
    q, k, v, dout = _qkvd(24)
    mask = ids[:, None] == ids[None, :]
    if causal:
        mask &= torch.ones(24, 24, dtype=torch.bool).tril()
    ref_in = [t.clone().requires_grad_() for t in (q, k, v)]
    _masked(*ref_in, mask).backward(dout)
    ref = _masked(q, k, v, mask)
    mine_in = [t.clone().requires_grad_() for t in (q, k, v)]
    out = grouped_attention(*mine_in, ids, causal=causal)
    out.backward(dout)
    assert (out - ref).abs().max() < 1e-12
    for a, b in zip(mine_in, ref_in, strict=True):
        assert (a.grad - b.grad).abs().max() < 1e-12


def test_grouped_attention_saves_linear_memory():
    """Doubling the pack doubles what autograd keeps (the mask would quadruple it)."""
    saved = []
    for n in (1024, 2048):
        q, k, v = (torch.randn(1, 2, n, 16, requires_grad=True) for _ in range(3))
        ids = torch.arange(n) // 300  # samples of 300 tokens
        run = lambda q=q, k=k, v=v, ids=ids: grouped_attention(q, k, v, ids)  # noqa: E731
        saved.append(measure_saved_bytes(run, [q, k, v]))
    assert saved[1] / saved[0] < 2.2, saved


def test_grouped_attention_names_a_wrong_id_shape():
    q = torch.zeros(1, 2, 6, 4)
    with pytest.raises(ValueError, match=r"sample_ids: expected shape \(6,\) for 6 tokens"):
        grouped_attention(q, q, q, torch.zeros(5, dtype=torch.long))


def _visible(rects, n, m):
    seen = torch.zeros(n, m, dtype=torch.int64)
    for qs, qe, ks, ke, causal in rects:
        block = torch.ones(qe - qs, ke - ks, dtype=torch.int64)
        seen[qs:qe, ks:ke] += block.tril() if causal else block
    return seen


@pytest.mark.parametrize("balanced", [True, False])
def test_block_rects_cover_exactly_the_visible_pairs(balanced):
    """Every (query chunk, key chunk) block of a causal packed sequence on 4 ranks, and of a
    non-causal one: each visible pair once, nothing else; every rectangle's query sees a key."""
    world, n = 4, 12
    g = torch.Generator().manual_seed(1)
    lengths = torch.randint(1, 15, (12,), generator=g)
    ids = torch.repeat_interleave(torch.arange(12), lengths)[: world * n]
    pos = causal_positions(n, world, balanced=balanced)  # (world, n)
    for causal in (True, False):
        for r in range(world):
            for s in range(world):
                qi, ki = ids[pos[r]], ids[pos[s]]
                if causal:
                    rects = block_rects(qi, ki, pos[r], pos[s])
                    want = (qi[:, None] == ki[None, :]) & (pos[s][None, :] <= pos[r][:, None])
                else:
                    rects = block_rects(qi, ki)
                    want = qi[:, None] == ki[None, :]
                assert torch.equal(_visible(rects, n, n), want.long()), (causal, r, s)
                for qs, qe, ks, ke, sq in rects:
                    assert qe > qs and ke > ks and (not sq or qe - qs == ke - ks)
