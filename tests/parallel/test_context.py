"""Ring and all-to-all attention over 2 gloo ranks equal full single-device attention, forward and
backward (fp64, tolerance 1e-10), for full, spatial and temporal layouts and GQA."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from parallel_harness import run_ranks

from vfm_core.models.attention_spec import AttentionSpec
from vfm_core.models.layers import attention
from vfm_core.models.local_attention import group_tokens, ungroup_tokens
from vfm_core.parallel.comm_stats import CommCounter, alltoall_bytes, ring_bytes
from vfm_core.parallel.context import (
    ContextParallelAttention,
    gather_seq,
    heads_to_seq,
    ring_attention,
    seq_chunk,
    seq_to_heads,
    ulysses_attention,
)

TOL = 1e-10
GRID = (4, 2, 3)  # (t, h, w): 24 tokens, 12 per rank on 2 ranks


def _reference(q, k, v, layout, ids=None):
    b = q.shape[0]
    if k.shape[1] != q.shape[1]:
        k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
        v = v.repeat_interleave(q.shape[1] // v.shape[1], dim=1)
    if layout != "full":
        q, k, v = (group_tokens(t, GRID, layout) for t in (q, k, v))
    mask = None if ids is None else (ids[:, None] == ids[None, :])[None, None]  # block diagonal
    out = attention(q, k, v, mask)
    return ungroup_tokens(out, b, GRID, layout) if layout != "full" else out


def _case(hq: int, hkv: int):
    g = torch.Generator().manual_seed(7)
    n = GRID[0] * GRID[1] * GRID[2]
    q = torch.randn(2, hq, n, 8, generator=g, dtype=torch.float64)
    k = torch.randn(2, hkv, n, 8, generator=g, dtype=torch.float64)
    v = torch.randn(2, hkv, n, 8, generator=g, dtype=torch.float64)
    dout = torch.randn(2, hq, n, 8, generator=g, dtype=torch.float64)
    return q, k, v, dout


def _compare(rank, world, fn, hq, hkv, layout, ids=None):
    """Run ``fn`` on this rank's chunk; return max |error| of out and of dq, dk, dv chunks."""
    q, k, v, dout = _case(hq, hkv)
    ref_in = [t.clone().requires_grad_() for t in (q, k, v)]
    ref = _reference(*ref_in, layout, ids)
    ref.backward(dout)
    loc = [seq_chunk(t, rank, world, dim=2).clone().requires_grad_() for t in (q, k, v)]
    out = fn(*loc)
    out.backward(seq_chunk(dout, rank, world, dim=2))
    errs = [(out - seq_chunk(ref, rank, world, dim=2)).abs().max().item()]
    for t_loc, t_ref in zip(loc, ref_in):
        errs.append((t_loc.grad - seq_chunk(t_ref.grad, rank, world, dim=2)).abs().max().item())
    return errs


def _worker_attention(rank, world):
    group = dist.group.WORLD
    results = {}
    for hq, hkv in ((4, 4), (4, 2), (4, 1)):
        results[f"ring/full/{hq}-{hkv}"] = _compare(
            rank, world, lambda q, k, v: ring_attention(q, k, v, group), hq, hkv, "full"
        )
        for layout in ("full", "spatial", "temporal"):
            results[f"a2a/{layout}/{hq}-{hkv}"] = _compare(
                rank,
                world,
                lambda q, k, v, lay=layout: ulysses_attention(
                    q, k, v, group, AttentionSpec(grid=GRID, layout=lay)
                ),
                hq,
                hkv,
                layout,
            )
    # packed sequence: samples of 5, 11 and 8 tokens over 2 chunks of 12 (sample 1 straddles
    # the boundary; sample 0 has no key on rank 1, sample 2 none on rank 0)
    ids = torch.tensor([0] * 5 + [1] * 11 + [2] * 8)
    for hq, hkv in ((4, 4), (4, 2)):
        results[f"ring/packed/{hq}-{hkv}"] = _compare(
            rank,
            world,
            lambda q, k, v: ring_attention(q, k, v, group, sample_ids=ids),
            hq,
            hkv,
            "full",
            ids,
        )
        results[f"a2a/packed/{hq}-{hkv}"] = _compare(
            rank,
            world,
            lambda q, k, v: ulysses_attention(q, k, v, group, AttentionSpec(groups={"full": ids})),
            hq,
            hkv,
            "full",
            ids,
        )
    hybrid = ContextParallelAttention(group, "hybrid")
    for layout in ("full", "spatial", "temporal"):
        results[f"hybrid/{layout}"] = _compare(
            rank,
            world,
            lambda q, k, v, lay=layout: hybrid(q, k, v, AttentionSpec(grid=GRID, layout=lay)),
            4,
            4,
            layout,
        )
    # the all-to-all pair is an exact round trip
    x = torch.randn(2, 4, 12, 8, dtype=torch.float64)
    results["roundtrip"] = [(heads_to_seq(seq_to_heads(x, group), group) - x).abs().max().item()]
    # gather_seq: forward concatenates rank chunks, backward keeps this rank's gradient chunk
    full = torch.arange(24, dtype=torch.float64).reshape(1, 24, 1)
    part = seq_chunk(full, rank, world).clone().requires_grad_()
    g = gather_seq(part, group)
    (g * full).sum().backward()
    results["gather"] = [
        (g - full).abs().max().item(),
        (part.grad - seq_chunk(full, rank, world)).abs().max().item(),
    ]
    return {
        "errors": results,
        "messages": _bad_input_messages(rank, world),
        "bytes": _measured_bytes(rank, world),
    }


def _measured_bytes(rank, world):
    """Bytes sent by one rank for fwd + bwd, measured by CommCounter vs the closed forms."""
    group = dist.group.WORLD
    q, k, v, dout = _case(4, 2)
    out = {}
    for name, fn in (
        ("ring", lambda q, k, v: ring_attention(q, k, v, group)),
        (
            "a2a",
            lambda q, k, v: ulysses_attention(
                q, k, v, group, AttentionSpec(grid=GRID, layout="temporal")
            ),
        ),
    ):
        loc = [seq_chunk(t, rank, world, dim=2).clone().requires_grad_() for t in (q, k, v)]
        with CommCounter() as counter:
            fn(*loc).backward(seq_chunk(dout, rank, world, dim=2))
        out[name] = counter.bytes
    loc = [seq_chunk(t, rank, world, dim=2).clone().requires_grad_() for t in (q, k, v)]
    with CommCounter() as counter:  # GRID has 4 frames: 2 whole frames per rank, no traffic
        spatial = AttentionSpec(grid=GRID, layout="spatial")
        ContextParallelAttention(group, "hybrid")(*loc, spatial).sum().backward()
    out["hybrid_spatial"] = counter.bytes
    n = q.shape[2]
    out["ring_formula"] = ring_bytes(b=2, tokens=n, dim_kv=2 * 8, cp=world, elem=8)
    out["a2a_formula"] = alltoall_bytes(b=2, tokens=n, dim=4 * 8, dim_kv=2 * 8, cp=world, elem=8)
    return out


def _bad_input_messages(rank, world):
    group = dist.group.WORLD
    q = torch.zeros(1, 3, 4, 8)
    msgs = []
    try:
        ulysses_attention(q, q, q, group)
    except ValueError as e:
        msgs.append(str(e))
    try:
        ContextParallelAttention(group, "ring")(
            q, q, q, AttentionSpec(grid=(2, 2, 2), layout="spatial")
        )
    except ValueError as e:
        msgs.append(str(e))
    try:
        seq_chunk(torch.zeros(1, 5, 2), rank, world)
    except ValueError as e:
        msgs.append(str(e))
    try:
        ring_attention(q, q, q, group, sample_ids=torch.zeros(5, dtype=torch.long))
    except ValueError as e:
        msgs.append(str(e))
    return msgs


@pytest.mark.slow
def test_ring_and_alltoall_equal_full_attention_forward_and_backward():
    results = run_ranks(_worker_attention, 2)
    for rank_result in results:
        assert len(rank_result["errors"]) == 21
        for name, errs in rank_result["errors"].items():
            assert max(errs) < TOL, f"{name}: max errors (out, dq, dk, dv) = {errs}"
    # communicated bytes match the closed forms the benchmark table uses
    for r in results:
        by = r["bytes"]
        assert by["ring"] == by["ring_formula"] > 0, by
        assert by["a2a"] == by["a2a_formula"] > 0, by
        assert by["hybrid_spatial"] == 0, by
    # bad inputs get errors naming the input and the problem
    msgs = results[0]["messages"]
    assert "3 heads not divisible by cp=2" in msgs[0]
    assert "full attention only" in msgs[1] and "'spatial'" in msgs[1]
    assert "5 tokens cannot be split evenly over 2 ranks" in msgs[2]
    assert "sample_ids: expected shape (8,) for 2 chunks of 4 tokens, got (5,)" in msgs[3]


def test_cp_mode_unknown_is_rejected():
    with pytest.raises(ValueError, match="mode 'zigzag' unknown"):
        ContextParallelAttention(None, "zigzag")


def _worker_ring_overlap(rank, world):
    """Ring over 4 ranks (3 K/V transfers): with the next transfer overlapping the current block
    (forward) and the gradient transfers overlapping the block before (backward) vs. sending and
    waiting first, both against full attention; packed ids straddle every chunk boundary."""
    group = dist.group.WORLD
    ids = torch.tensor([0] * 5 + [1] * 9 + [2] * 3 + [3] * 7)  # 24 tokens, chunks of 6
    out = {}
    for overlap in (True, False):
        for name, sample_ids in (("full", None), ("packed", ids)):
            out[f"{name}/overlap={overlap}"] = _compare(
                rank,
                world,
                lambda q, k, v, o=overlap, s=sample_ids: ring_attention(
                    q, k, v, group, sample_ids=s, overlap=o
                ),
                4,
                2,
                "full",
                sample_ids,
            )
    q, k, v, dout = _case(4, 2)
    runs = []
    for overlap in (True, False):
        loc = [seq_chunk(t, rank, world, dim=2).clone().requires_grad_() for t in (q, k, v)]
        res = ring_attention(*loc, group, sample_ids=ids, overlap=overlap)
        res.backward(seq_chunk(dout, rank, world, dim=2))
        runs.append([res.detach()] + [t.grad for t in loc])
    out["bitwise"] = [float(not torch.equal(a, b)) for a, b in zip(*runs)]
    return out


@pytest.mark.slow
def test_ring_overlap_equals_sequential_ring_and_full_attention_on_4_ranks():
    for rank_result in run_ranks(_worker_ring_overlap, 4):
        assert rank_result["bitwise"] == [0.0] * 4, "overlap changed the numbers"
        for name, errs in rank_result.items():
            if name != "bitwise":
                assert max(errs) < TOL, f"{name}: max errors (out, dq, dk, dv) = {errs}"
