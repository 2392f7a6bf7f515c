"""Context parallelism: attention over a sequence split across the ranks of a process group.

Every rank holds one contiguous chunk of the raster-ordered (t, h, w) token sequence (rank r owns
tokens ``[r*n, (r+1)*n)``). Two exact algorithms, both differentiable end to end because they are
built from differentiable collectives (each collective's backward is its adjoint collective),
fused attention kernels and, for the ring, an explicit backward that recomputes each block from the
saved log-sum-exp. Neither ever builds an n x n score matrix:

* **ring** (:func:`~vfm_core.parallel.ring.ring_attention`, Liu et al. 2023 "Ring Attention";
  paper §4 for full 3D attention): K/V blocks travel around the ring, each block runs a fused kernel
  that returns its log-sum-exp and the blocks merge online, forward and backward (PyTorch's own
  ring where it covers the case; :mod:`vfm_core.parallel.ring`).
* **all-to-all** (:func:`ulysses_attention`, Jacobs et al. 2023 "DeepSpeed-Ulysses"): one
  all-to-all re-shards (sequence-chunk, all heads) -> (all tokens, head-chunk), attention runs
  locally with any layout (full / spatial / temporal, so it serves ST-DiT), a second all-to-all
  shards back. Needs heads divisible by the group size.

:func:`cp_attention` is the callable ``parallelize_dit`` hangs on each self-attention module: the
paper's ST-DiT hybrid picks all-to-all for spatial/temporal and ring for full attention.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

import torch
import torch.distributed as dist

from vfm_core.geometry import Grid
from vfm_core.models.attention import group_tokens, ungroup_tokens
from vfm_core.models.flash import grouped_attention
from vfm_core.models.layers import attention
from vfm_core.parallel.ring import causal_positions, ring_attention

__all__ = ["causal_positions", "ring_attention"]  # re-exported: the CP entry points live here

CPMode = Literal["ring", "alltoall", "hybrid"]


# ------------------------------------------------------------------ differentiable collectives
class _AllToAll(torch.autograd.Function):
    """all_to_all over dim 0 of a (world, ...) tensor: chunk i goes to rank i. It is its own
    adjoint, so the backward is the same exchange of the gradient."""

    @staticmethod
    def forward(ctx, group, x):
        ctx.group = group
        x = x.contiguous()
        out = torch.empty_like(x, memory_format=torch.contiguous_format)
        dist.all_to_all_single(out, x, group=group)
        return out

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous()
        out = torch.empty_like(grad, memory_format=torch.contiguous_format)
        dist.all_to_all_single(out, grad, group=ctx.group)
        return None, out


def seq_to_heads(x: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    """(B, H, n, d) sequence chunk, all heads -> (B, H/P, P*n, d) all tokens, head chunk."""
    p = dist.get_world_size(group)
    b, h, n, d = x.shape
    x = x.reshape(b, p, h // p, n, d).transpose(0, 1)  # (P, B, H/P, n, d) head chunk i -> rank i
    x = _AllToAll.apply(group, x)  # (P, B, H/P, n, d): slot j = sequence chunk j
    return x.permute(1, 2, 0, 3, 4).reshape(b, h // p, p * n, d)  # (B, H/P, N, d)


def heads_to_seq(x: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    """Inverse of :func:`seq_to_heads`: (B, H/P, P*n, d) -> (B, H, n, d)."""
    p = dist.get_world_size(group)
    b, hp, big_n, d = x.shape
    n = big_n // p
    x = x.reshape(b, hp, p, n, d).permute(2, 0, 1, 3, 4)  # (P, B, H/P, n, d) seq chunk j -> rank j
    x = _AllToAll.apply(group, x)  # (P, B, H/P, n, d): slot i = head chunk i
    return x.transpose(0, 1).reshape(b, p * hp, n, d)  # (B, H, n, d)


def ulysses_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    group: dist.ProcessGroup,
    *,
    grid: Grid | None = None,
    layout: str = "full",
    sample_ids: torch.Tensor | None = None,
) -> torch.Tensor:
    """All-to-all attention: q/k/v (B, H, n, d) sequence chunks -> (B, Hq, n, d).

    After the re-shard each rank holds every token of H/P heads, so ``layout`` (full, spatial
    within a frame, temporal across frames) groups tokens exactly as on one device, and a packed
    sequence (``sample_ids`` (N,), full layout) attends within the groups of the whole pack
    (:func:`~vfm_core.models.flash.grouped_attention`: no (N, N) mask).
    """
    if sample_ids is not None and layout != "full":
        raise ValueError(f"packed sequences (sample_ids) need layout 'full', not {layout!r}")
    p = dist.get_world_size(group)
    hq, hkv = q.shape[1], k.shape[1]
    if hq % p:
        raise ValueError(f"all-to-all context parallel: {hq} heads not divisible by cp={p}")
    if hkv % p:  # GQA with fewer K/V heads than ranks: expand K/V to the query heads first
        k = k.repeat_interleave(hq // hkv, dim=1)  # (B, Hq, n, d)
        v = v.repeat_interleave(hq // hkv, dim=1)
    q, k, v = (seq_to_heads(t, group) for t in (q, k, v))  # (B, H/P, N, d)
    b = q.shape[0]
    if layout != "full":
        if grid is None:
            raise ValueError(f"layout {layout!r} needs the token grid")
        q, k, v = (group_tokens(t, grid, layout) for t in (q, k, v))  # (B', H/P, S, d)
    if sample_ids is not None:
        out = grouped_attention(q, k, v, sample_ids.to(q.device))  # (B, H/P, N, d)
    else:
        out = attention(q, k, v)  # (B', H/P, S, d)
    if layout != "full":
        out = ungroup_tokens(out, b, grid, layout)  # (B, H/P, N, d)
    return heads_to_seq(out, group)  # (B, Hq, n, d)


def local_attention(q, k, v, *, grid: Grid) -> torch.Tensor:
    """Spatial attention of a chunk of whole frames ``grid`` = (local t, h, w): no communication."""
    b = q.shape[0]
    q, k, v = (group_tokens(t, grid, "spatial") for t in (q, k, v))  # (B*t, H, h*w, d)
    return ungroup_tokens(attention(q, k, v), b, grid, "spatial")  # (B, Hq, n, d)


def cp_attention(
    group: dist.ProcessGroup, mode: CPMode = "hybrid", *, balanced: bool = True
) -> Callable[..., torch.Tensor]:
    """The attention callable for a context-parallel self-attention (``Attention.attn_fn``).

    ``ring``: ring for every layout (spatial/temporal need the local chunk to hold whole groups,
    so ring is only valid for ``full``); ``alltoall``: all-to-all for every layout; ``hybrid``
    (paper, ST-DiT): all-to-all for spatial/temporal, ring for full attention — and spatial
    attention with no communication at all when every rank's chunk holds whole frames
    (latent frames divisible by the CP degree), since tokens are split in (t, h, w) raster order.
    Causal attention (``layout="causal"``, the autoregressive family) always runs the ring, over
    the token placement of :func:`causal_positions` (``balanced``: zigzag).
    """
    if mode not in ("ring", "alltoall", "hybrid"):
        raise ValueError(f"context-parallel mode {mode!r} unknown (ring | alltoall | hybrid)")

    def attn_fn(
        q, k, v, *, grid: Grid | None = None, layout: str = "full", sample_ids=None
    ) -> torch.Tensor:
        if layout == "causal":  # autoregressive family: causal ring over balanced chunks
            if sample_ids is not None:  # packed documents: ids of every rank's chunk, in order
                p = dist.get_world_size(group)
                pos = causal_positions(q.shape[2], p, balanced=balanced)  # (P, n)
                sample_ids = sample_ids[pos.flatten().to(sample_ids.device)]
            return ring_attention(
                q, k, v, group, sample_ids=sample_ids, causal=True, balanced=balanced
            )
        if mode == "hybrid" and layout == "spatial" and grid is not None and sample_ids is None:
            p = dist.get_world_size(group)
            if grid[0] % p == 0:  # the chunk holds whole frames: spatial attention is local
                return local_attention(q, k, v, grid=(grid[0] // p, grid[1], grid[2]))
        use_ring = mode == "ring" or (mode == "hybrid" and layout == "full")
        if use_ring:
            if layout != "full":
                raise ValueError(
                    f"ring context parallelism supports full attention only, not {layout!r} "
                    "(use cp mode 'hybrid' or 'alltoall' for ST-DiT)"
                )
            return ring_attention(q, k, v, group, sample_ids=sample_ids)
        return ulysses_attention(q, k, v, group, grid=grid, layout=layout, sample_ids=sample_ids)

    return attn_fn


# ------------------------------------------------------------------ sequence split / gather
def seq_chunk(x: torch.Tensor, index: int, parts: int, dim: int = 1) -> torch.Tensor:
    """This rank's contiguous chunk ``index`` of ``parts`` along ``dim``; the sequence length
    must divide evenly (checked, naming the sizes)."""
    size = x.shape[dim]
    if size % parts:
        raise ValueError(
            f"sequence of {size} tokens cannot be split evenly over {parts} ranks "
            "(choose latent sizes whose token count divides cp*tp)"
        )
    return x.narrow(dim, index * (size // parts), size // parts)


class _GatherSeq(torch.autograd.Function):
    """All-gather sequence chunks (rank order) along ``dim``. Backward keeps this rank's chunk of
    the gradient: the gathered tensor feeds an identical (replicated) computation on every rank, so
    each rank's slice of that gradient is already the full gradient of its chunk."""

    @staticmethod
    def forward(ctx, group, dim, x):
        ctx.group, ctx.dim = group, dim
        ctx.index, ctx.parts = dist.get_rank(group), dist.get_world_size(group)
        x = x.contiguous()
        parts = [torch.empty(x.shape, dtype=x.dtype, device=x.device) for _ in range(ctx.parts)]
        dist.all_gather(parts, x, group=group)
        return torch.cat(parts, dim=dim)

    @staticmethod
    def backward(ctx, grad):
        return None, None, seq_chunk(grad, ctx.index, ctx.parts, ctx.dim).contiguous()


class _SplitSeq(torch.autograd.Function):
    """This rank's chunk of a sequence replicated over ``group``; backward all-gathers the
    chunks' gradients, so every rank gets the gradient of the whole sequence (the adjoint of
    :class:`_GatherSeq`). For an input computed by a module sharded over ``group`` (each rank
    must see the gradient of every token, not only of its chunk)."""

    @staticmethod
    def forward(ctx, group, dim, x):
        ctx.group, ctx.dim = group, dim
        return seq_chunk(x, dist.get_rank(group), dist.get_world_size(group), dim).contiguous()

    @staticmethod
    def backward(ctx, grad):
        return None, None, gather_seq(grad.contiguous(), ctx.group, ctx.dim)


def split_seq(x: torch.Tensor, group: dist.ProcessGroup, dim: int = 1) -> torch.Tensor:
    """(B, P*n, ...) replicated -> (B, n, ...) this rank's chunk; gradients all-gathered."""
    if dist.get_world_size(group) == 1:
        return x
    return _SplitSeq.apply(group, dim, x)


def gather_seq(x: torch.Tensor, group: dist.ProcessGroup, dim: int = 1) -> torch.Tensor:
    """(B, n, ...) chunk -> (B, P*n, ...) full sequence on every rank of ``group``."""
    if dist.get_world_size(group) == 1:
        return x
    return _GatherSeq.apply(group, dim, x)
