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
  locally as the spec says (full / spatial / temporal, packs: so it serves ST-DiT), a second
  all-to-all shards back. Needs heads divisible by the group size.

:class:`ContextParallelAttention` is the attention core ``parallelize_dit`` swaps into each
self-attention module: the paper's ST-DiT hybrid picks all-to-all for spatial/temporal and ring
for full attention; it computes with the kernel of the single-device core it replaced.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Literal

import torch
import torch.distributed as dist
from torch import nn

from vfm_core.models.attention_spec import FULL_ATTENTION, AttentionSpec
from vfm_core.models.local_attention import LocalAttention, local_attention
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
    spec: AttentionSpec = FULL_ATTENTION,
    *,
    backend: str = "sdpa",
) -> torch.Tensor:
    """All-to-all attention: q/k/v (B, H, n, d) sequence chunks -> (B, Hq, n, d).

    After the re-shard each rank holds every token of H/P heads, so the spec's layout (full,
    spatial within a frame, temporal across frames) groups tokens exactly as on one device, and a
    pack attends within the groups of the whole pack (:func:`~vfm_core.models.flash.
    grouped_attention`: no (N, N) mask); kernel ``backend``.
    """
    p = dist.get_world_size(group)
    hq, hkv = q.shape[1], k.shape[1]
    if hq % p:
        raise ValueError(f"all-to-all context parallel: {hq} heads not divisible by cp={p}")
    if hkv % p:  # GQA with fewer K/V heads than ranks: expand K/V to the query heads first
        k = k.repeat_interleave(hq // hkv, dim=1)  # (B, Hq, n, d)
        v = v.repeat_interleave(hq // hkv, dim=1)
    q, k, v = (seq_to_heads(t, group) for t in (q, k, v))  # (B, H/P, N, d)
    out = local_attention(q, k, v, spec, backend=backend)  # (B, H/P, N, d)
    return heads_to_seq(out, group)  # (B, Hq, n, d)


class ContextParallelAttention(nn.Module):
    """The attention core of a context-parallel self-attention (``Attention.core``), over the
    ranks of ``group``; no parameters, no buffers. ``local``: the single-device core it
    replaces, whose kernel (``backend``) every mode computes with.

    ``ring``: ring for every layout (spatial/temporal need the local chunk to hold whole groups,
    so ring is only valid for ``full`` and packs); ``alltoall``: all-to-all for every layout;
    ``hybrid`` (paper, ST-DiT): all-to-all for spatial/temporal, ring for full attention, packed
    or not — and spatial attention with no communication at all when every rank's chunk holds
    whole frames (latent frames divisible by the CP degree), since tokens are split in (t, h, w)
    raster order. Causal attention (the autoregressive family) always runs the ring, over the
    token placement of :func:`causal_positions` (``balanced``: zigzag).
    """

    def __init__(
        self,
        group: dist.ProcessGroup,
        mode: CPMode = "hybrid",
        *,
        local: LocalAttention | None = None,
        balanced: bool = True,
    ):
        super().__init__()
        if mode not in ("ring", "alltoall", "hybrid"):
            raise ValueError(f"context-parallel mode {mode!r} unknown (ring | alltoall | hybrid)")
        self.group, self.mode, self.balanced = group, mode, balanced
        self.local = local if local is not None else LocalAttention()

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, spec: AttentionSpec
    ) -> torch.Tensor:
        """This rank's chunk q (B, Hq, n, d), k/v (B, Hkv, n, d) -> (B, Hq, n, d)."""
        p, backend = dist.get_world_size(self.group), self.local.backend
        ids, grid = spec.sample_ids, spec.grid  # ids: (N,) of the whole pack
        if spec.causal:  # autoregressive family: causal ring over balanced chunks
            if ids is not None:  # packed documents: ids of every rank's chunk, in order
                pos = causal_positions(q.shape[2], p, balanced=self.balanced)  # (P, n)
                ids = ids[pos.flatten().to(ids.device)]
            return ring_attention(
                q, k, v, self.group, sample_ids=ids, causal=True, balanced=self.balanced,
                backend=backend,
            )  # fmt: skip
        if self.mode == "hybrid" and spec.layout == "spatial" and grid is not None:
            if ids is None and grid[0] % p == 0:  # whole frames per chunk: spatial is local
                return self.local(q, k, v, replace(spec, grid=(grid[0] // p, *grid[1:])))
        if self.mode == "ring" or (self.mode == "hybrid" and spec.layout == "full"):
            if spec.layout != "full" and ids is None:
                raise ValueError(
                    f"ring context parallelism supports full attention only, not "
                    f"{spec.layout!r} (use cp mode 'hybrid' or 'alltoall' for ST-DiT)"
                )
            return ring_attention(q, k, v, self.group, sample_ids=ids, backend=backend)
        return ulysses_attention(q, k, v, self.group, spec, backend=backend)

    def extra_repr(self) -> str:
        return f"mode={self.mode!r}, balanced={self.balanced}"


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
