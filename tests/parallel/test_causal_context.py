"""Causal ring attention (the autoregressive family) over 4 gloo ranks equals causal attention on
one device, forward and backward (fp64), with the balanced (zigzag) and the contiguous token
placement, with GQA; the balanced placement evens the causal work per rank. Under tensor
parallelism the causal model's head is vocabulary-parallel: no rank holds the full logits, and
the parallel cross-entropy and its gradients equal one device's."""

from __future__ import annotations

import torch
import torch.distributed as dist
from parallel_harness import run_ranks

from vfm_core.config import ModelConfig
from vfm_core.models.ar import CausalVideoTransformer, next_token_loss
from vfm_core.models.attention_spec import AttentionSpec
from vfm_core.models.layers import attention
from vfm_core.models.local_attention import causal_mask
from vfm_core.parallel.context import ContextParallelAttention, causal_positions, ring_attention
from vfm_core.parallel.dims import ParallelDims
from vfm_core.parallel.parallelize import parallelize_dit, sync_grads

N = 32  # tokens: 8 per rank on 4 ranks


def _case(hq, hkv):
    g = torch.Generator().manual_seed(3)
    shape = lambda h: (2, h, N, 8)  # noqa: E731
    q = torch.randn(shape(hq), generator=g, dtype=torch.float64)
    k = torch.randn(shape(hkv), generator=g, dtype=torch.float64)
    v = torch.randn(shape(hkv), generator=g, dtype=torch.float64)
    return q, k, v, torch.randn(shape(hq), generator=g, dtype=torch.float64)


def _worker(rank, world):
    errs = {}
    for balanced in (True, False):
        for hq, hkv in ((4, 4), (4, 2)):
            q, k, v, dout = _case(hq, hkv)
            ref_in = [t.clone().requires_grad_() for t in (q, k, v)]
            kr, vr = (t.repeat_interleave(hq // hkv, dim=1) for t in ref_in[1:])
            ref = attention(ref_in[0], kr, vr, causal_mask(N, N))
            ref.backward(dout)
            idx = causal_positions(N // world, world, balanced=balanced)[rank]  # (n,)
            loc = [t[:, :, idx].clone().requires_grad_() for t in (q, k, v)]
            if balanced:  # through the core parallelize_dit swaps into causal attention
                core = ContextParallelAttention(dist.group.WORLD)
                out = core(*loc, AttentionSpec(layout="causal"))
            else:
                out = ring_attention(*loc, dist.group.WORLD, causal=True, balanced=False)
            out.backward(dout[:, :, idx])
            e = [(out - ref[:, :, idx]).abs().max().item()]
            e += [(a.grad - b.grad[:, :, idx]).abs().max().item() for a, b in zip(loc, ref_in)]
            errs[f"balanced={balanced}/{hq}-{hkv}"] = max(e)
    return errs


def test_causal_ring_equals_one_device():
    for errs in run_ranks(_worker, 4):
        for case, err in errs.items():
            assert err < 1e-10, (case, err)


def test_balanced_placement_evens_the_work():
    """(query, key) pairs each rank computes: the causal triangle's share per rank."""
    world, n = 4, 64
    for balanced, spread in ((True, 1.0), (False, 3.0)):
        pos = causal_positions(n // world, world, balanced=balanced)
        work = [int((pos.flatten()[None, :] <= pos[r][:, None]).sum()) for r in range(world)]
        assert sum(work) == n * (n + 1) // 2
        assert max(work) / min(work) <= spread + 1e-9 if balanced else max(work) / min(work) > 3


def _worker_vocab_parallel(rank, world):
    """Per text conditioning: cross-attention, and the pooled caption on the embedding (cut by
    sequence parallelism like it, its gradient summed over the ranks); and with the fused q/k/v
    projection (``model.fused_proj``: whole GQA groups per rank); and with absolute positions
    only (``model.rope=false``: the position embedding cut by sequence parallelism too)."""
    out = {text: _vocab_parallel_step(world, text) for text in ("cross", "pooled")}
    out["fused"] = _vocab_parallel_step(world, "cross", fused_proj=True, mlp="swiglu")
    out["absolute"] = _vocab_parallel_step(world, "pooled", rope=False, abs_pos=6)
    return out


def _vocab_parallel_step(world: int, text_conditioning: str, **over) -> dict:
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor.parallel import loss_parallel

    cfg = ModelConfig(
        arch="ar",
        vocab_size=50,
        hidden=32,
        depth=2,
        heads=4,
        kv_heads=2,
        text_dim=8,
        text_len=2,
        patch=(1, 1, 1),
        text_conditioning=text_conditioning,
        **over,
    )
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, 50, (2, 2, 2, 4), generator=g)
    text = torch.randn(2, 2, 8, generator=g, dtype=torch.float64)
    torch.manual_seed(0)
    ref = CausalVideoTransformer(cfg).double()
    torch.manual_seed(0)
    model = CausalVideoTransformer(cfg).double()
    loss_ref = next_token_loss(ref(tokens, text), tokens.flatten(1))
    loss_ref.backward()
    model = parallelize_dit(model, parallel_dims=ParallelDims(tp=world, world_size=world))
    logits = model(tokens, text)
    assert isinstance(logits, DTensor) and logits.to_local().shape[-1] == 50 // world
    with loss_parallel():
        loss = next_token_loss(logits, tokens.flatten(1))
        loss.backward()
    sync_grads(model)
    grads = dict(ref.named_parameters())
    err = 0.0
    for name, p in model.named_parameters():
        grad = p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad
        err = max(err, (grad - grads[name].grad).abs().max().item())
    loss = loss.full_tensor() if isinstance(loss, DTensor) else loss
    return {"loss": abs(loss.item() - loss_ref.item()), "grad": err}


def test_vocab_parallel_head_and_loss_equal_one_device():
    for r in run_ranks(_worker_vocab_parallel, 2):
        for text, e in r.items():
            assert e["loss"] < 1e-12 and e["grad"] < 1e-10, (text, e)
