"""Attention kernels that return their log-sum-exp and never build the score matrix.

Context-parallel attention merges partial results of K/V blocks online (Milakov & Gimelshein
2018): each block needs the attention output *and* the log-sum-exp of its scores, forward, and a
backward that takes the merged output and log-sum-exp (Dao 2023, FlashAttention-2 §3.1: the
softmax is recomputed blockwise from the saved log-sum-exp). PyTorch's fused kernels provide
both, so nothing n x n is ever held:

* CPU: ``aten._scaled_dot_product_flash_attention_for_cpu`` (+ its ``_backward``), any float
  dtype, grouped-query heads natively (K/V with fewer heads than q);
* CUDA: ``aten._scaled_dot_product_flash_attention`` (+ backward), fp16 / bf16; K/V heads are
  repeated to the query heads first and their gradients summed back.

:func:`flash_forward` / :func:`flash_backward` are the two kernel calls (no autograd: the ring's
``autograd.Function`` calls them); :func:`grouped_attention` is differentiable attention under a
group-id mask (packed samples, ST-DiT groups) without the (N, N) mask: groups of equal length are
batched into one fused call each.
"""

from __future__ import annotations

import math

import torch
from torch.utils.weak import WeakIdKeyDictionary

from vfm_core.models.layers import attention

aten = torch.ops.aten

Aux = tuple
"""What a CUDA flash forward returns besides (out, lse) and its backward needs again."""


def _heads_to(x: torch.Tensor, heads: int) -> torch.Tensor:
    """(B, Hkv, S, d) -> (B, heads, S, d): each K/V head repeated for its query heads."""
    return x if x.shape[1] == heads else x.repeat_interleave(heads // x.shape[1], dim=1)


def _heads_sum(grad: torch.Tensor, kv_heads: int) -> torch.Tensor:
    """Inverse of :func:`_heads_to` for gradients: (B, Hq, S, d) -> (B, Hkv, S, d)."""
    b, hq, s, d = grad.shape
    if hq == kv_heads:
        return grad
    return grad.view(b, kv_heads, hq // kv_heads, s, d).sum(2)


def flash_forward(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = False, scale: float
) -> tuple[torch.Tensor, torch.Tensor, Aux]:
    """q (B, Hq, n, d), k/v (B, Hkv, m, d) (n, m >= 1; ``causal``: n == m) -> (out (B, Hq, n, d)
    in q's dtype, lse (B, Hq, n) float32 (float64 for float64 inputs), aux for the backward)."""
    if q.device.type == "cuda":
        hq = q.shape[1]
        out, lse, *aux = aten._scaled_dot_product_flash_attention(
            q, _heads_to(k, hq), _heads_to(v, hq), 0.0, causal, False, scale=scale
        )
        return out, lse, tuple(aux[:6])  # cum_seq_q, cum_seq_k, max_q, max_k, seed, offset
    out, lse = aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, causal, scale=scale)
    return out, lse, ()


def flash_backward(
    dout: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    aux: Aux = (),
    *,
    causal: bool = False,
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gradients (dq, dk, dv) of one block given the *merged* ``out`` and ``lse`` of every query
    (shapes as :func:`flash_forward`): the block's softmax is exp(q k^T * scale - lse), so the
    partial gradients of all blocks add up to the gradient of the whole attention."""
    if q.device.type == "cuda":
        hq, hkv = q.shape[1], k.shape[1]
        cum_q, cum_k, max_q, max_k, seed, offset = aux
        dq, dk, dv = aten._scaled_dot_product_flash_attention_backward(
            dout, q, _heads_to(k, hq), _heads_to(v, hq), out, lse, cum_q, cum_k, max_q, max_k,
            0.0, causal, seed, offset, scale=scale,
        )  # fmt: skip
        return dq, _heads_sum(dk, hkv), _heads_sum(dv, hkv)
    return aten._scaled_dot_product_flash_attention_for_cpu_backward(
        dout, q, k, v, out, lse, 0.0, causal, scale=scale
    )


def default_scale(q: torch.Tensor) -> float:
    """Softmax scale 1/sqrt(d) of queries (..., d)."""
    return 1.0 / math.sqrt(q.shape[-1])


def grouped_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    ids: torch.Tensor,
    *,
    causal: bool = False,
    backend: str = "sdpa",
) -> torch.Tensor:
    """Attention where token i sees token j only if ``ids[i] == ids[j]`` (and, ``causal``,
    j <= i): q (B, Hq, N, d), k/v (B, Hkv, N, d), ids (N,) int -> (B, Hq, N, d); kernel
    ``backend`` (:func:`~vfm_core.models.layers.attention`).

    The tokens are sorted by group (stably, so a group keeps its order) and every set of groups
    of one length runs as one batched fused call of shape (B·G, H, length, d): memory O(N), where
    the boolean (N, N) mask costs N^2 bytes and the CPU kernel saves it for backward. Groups need
    not be contiguous (ST-DiT's temporal groups are strided in raster order)."""
    n = q.shape[2]
    if ids.shape != (n,):
        shape = tuple(ids.shape)
        raise ValueError(f"sample_ids: expected shape ({n},) for {n} tokens, got {shape}")
    buckets, inverse = group_buckets(ids)
    if inverse is None:  # one group: plain attention
        return attention(q, k, v, causal=causal, backend=backend)
    b, hq, d = q.shape[0], q.shape[1], q.shape[3]
    outs = []
    for tok in buckets:
        tok = tok.to(q.device)
        g, length = tok.shape
        qkv = (_bucket(t, tok) for t in (q, k, v))
        o = attention(*qkv, causal=causal, backend=backend)  # (B*G_L, Hq, L, d)
        outs.append(o.view(b, g, hq, length, d).transpose(1, 2).reshape(b, hq, g * length, d))
    return torch.cat(outs, dim=2).index_select(2, inverse.to(q.device))  # (B, Hq, N, d)


_buckets: WeakIdKeyDictionary = WeakIdKeyDictionary()
"""Group buckets per ids tensor: a pack's ids serve every layer of a step, so they are sorted
(and read on the host) once, not once per layer."""


def group_buckets(ids: torch.Tensor) -> tuple[list[torch.Tensor], torch.Tensor | None]:
    """The groups of ``ids`` (N,) by length: [(G_L, L) token indices of the G_L groups of each
    length L], and the inverse permutation (N,) from their concatenation back to token order
    (None: a single group)."""
    if ids in _buckets:
        return _buckets[ids]
    order = torch.argsort(ids, stable=True)  # (N,) tokens grouped, in order within a group
    _, counts = torch.unique_consecutive(ids[order], return_counts=True)  # (G,)
    if counts.numel() == 1:
        plan: tuple[list[torch.Tensor], torch.Tensor | None] = ([], None)
    else:
        starts = torch.cumsum(counts, 0) - counts  # (G,) first sorted index of every group
        buckets = []
        for length in torch.unique(counts).tolist():
            first = starts[counts == length]  # (G_L,)
            buckets.append(order[first[:, None] + torch.arange(length, device=ids.device)])
        inverse = torch.argsort(torch.cat([t.flatten() for t in buckets]))  # (N,)
        plan = (buckets, inverse)
    _buckets[ids] = plan
    return plan


def _bucket(t: torch.Tensor, tok: torch.Tensor) -> torch.Tensor:
    """(B, H, N, d) and the tokens of G groups of length L (G, L) -> (B*G, H, L, d)."""
    b, h, _, d = t.shape
    g, length = tok.shape
    x = t.index_select(2, tok.flatten()).view(b, h, g, length, d)
    return x.transpose(1, 2).reshape(b * g, h, length, d)
