"""Context parallelism: attention over a sequence split across the ranks of a process group.

Every rank holds one contiguous chunk of the raster-ordered (t, h, w) token sequence (rank r owns
tokens ``[r*n, (r+1)*n)``). Two exact algorithms, both differentiable end to end because they are
built from differentiable collectives (each collective's backward is its adjoint collective) and
ordinary autograd ops — no hand-written backward to get wrong:

* **ring** (:func:`ring_attention`, Liu et al. 2023 "Ring Attention"; paper §4 for full 3D
  attention): K/V blocks travel around the ring with P2P ``batch_isend_irecv``; each rank merges the
  partial softmax of every block with the online-softmax rule (log-sum-exp), so the result equals
  full attention. The backward of the shift sends the K/V gradients back the other way.
* **all-to-all** (:func:`ulysses_attention`, Jacobs et al. 2023 "DeepSpeed-Ulysses"): one
  all-to-all re-shards (sequence-chunk, all heads) -> (all tokens, head-chunk), attention runs
  locally with any layout (full / spatial / temporal, so it serves ST-DiT), a second all-to-all
  shards back. Needs heads divisible by the group size.

:func:`cp_attention` is the callable ``parallelize_dit`` hangs on each self-attention module: the
paper's ST-DiT hybrid picks all-to-all for spatial/temporal and ring for full attention.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Literal

import torch
import torch.distributed as dist

from vfm_core.geometry import Grid
from vfm_core.models.attention import _group, _ungroup
from vfm_core.models.layers import attention

CPMode = Literal["ring", "alltoall", "hybrid"]


# ------------------------------------------------------------------ differentiable collectives
def _start_send_recv(tensors: list[torch.Tensor], group: dist.ProcessGroup, shift: int):
    """Start sending every tensor to the rank ``shift`` steps ahead in ``group`` and receiving
    from the rank behind; returns (receive buffers, requests). The buffers hold the data only
    after every request's ``wait()``."""
    world = dist.get_world_size(group)
    rank = dist.get_rank(group)
    dst = dist.get_global_rank(group, (rank + shift) % world)
    src = dist.get_global_rank(group, (rank - shift) % world)
    tensors = [t.contiguous() for t in tensors]
    recv = [torch.empty_like(t, memory_format=torch.contiguous_format) for t in tensors]
    ops = [dist.P2POp(dist.isend, t, dst, group) for t in tensors]
    ops += [dist.P2POp(dist.irecv, r, src, group) for r in recv]
    return recv, dist.batch_isend_irecv(ops)


def _ring_send_recv(tensors: list[torch.Tensor], group: dist.ProcessGroup, shift: int):
    """Send every tensor to the rank ``shift`` steps ahead in ``group``, receive from behind."""
    recv, reqs = _start_send_recv(tensors, group, shift)
    for req in reqs:
        req.wait()
    return recv


class _RingShift(torch.autograd.Function):
    """Forward: pass (k, v) one rank ahead. Backward: pass their gradients one rank back."""

    @staticmethod
    def forward(ctx, group, k, v):
        ctx.group = group
        return tuple(_ring_send_recv([k, v], group, 1))

    @staticmethod
    def backward(ctx, dk, dv):
        return (None, *_ring_send_recv([dk, dv], ctx.group, -1))


class _Transfer:
    """The in-flight requests and receive buffers of one asynchronous ring exchange, shared by the
    :class:`_RingStart` / :class:`_RingWait` pair that brackets the compute it overlaps."""

    __slots__ = ("reqs", "recv")

    def __init__(self) -> None:
        self.reqs: list = []
        self.recv: list[torch.Tensor] = []

    def wait(self) -> list[torch.Tensor]:
        for req in self.reqs:
            req.wait()
        self.reqs = []
        return self.recv


class _RingStart(torch.autograd.Function):
    """Forward: *start* passing (k, v) one rank ahead and return the (still filling) receive
    buffers. Backward: wait for the gradients :class:`_RingWait` started sending one rank back.

    With the pair, the transfer of the next K/V block runs while the current block is computed
    (forward), and the transfer of a block's K/V gradients runs while autograd computes the
    gradients of the block before it (backward): the two ops sit on either side of that block's
    compute in the graph. Exactly one exchange is in flight at a time on every rank, in the same
    order, so the P2P pairs always match.
    """

    @staticmethod
    def forward(ctx, group, transfer, k, v):
        ctx.transfer = transfer
        transfer.recv, transfer.reqs = _start_send_recv([k, v], group, 1)
        return tuple(transfer.recv)

    @staticmethod
    def backward(ctx, _dk, _dv):  # the received gradients, not these pass-throughs, are ours
        dk, dv = ctx.transfer.wait()
        return None, None, dk, dv


class _RingWait(torch.autograd.Function):
    """Forward: wait until the buffers of :class:`_RingStart` are filled (identity on them).
    Backward: start sending their gradients one rank back; :class:`_RingStart` collects them."""

    @staticmethod
    def forward(ctx, group, transfer, k, v):
        ctx.group, ctx.transfer = group, transfer
        transfer.wait()
        return k.view_as(k), v.view_as(v)

    @staticmethod
    def backward(ctx, dk, dv):
        t = ctx.transfer
        t.recv, t.reqs = _start_send_recv([dk, dv], ctx.group, -1)
        return None, None, dk, dv


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


# ------------------------------------------------------------------ ring attention
def _block_attention(q, k, v, scale, mask=None):
    """Softmax attention of q against one K/V block: (out, lse), out (B, H, n, d), lse (B, H, n).

    ``mask`` (n, m) bool, True = attend (packed sequences). A query row with no visible key in
    this block gets out = 0 and a very negative finite lse, so the merge ignores it and no NaN
    reaches the gradients (unlike ``logsumexp`` of an all -inf row).
    """
    scores = (q @ k.transpose(-2, -1)) * scale  # (B, H, n, m)
    if mask is None:
        lse = torch.logsumexp(scores, dim=-1)  # (B, H, n)
        return torch.softmax(scores, dim=-1) @ v, lse  # (B, H, n, d)
    scores = scores.masked_fill(~mask, float("-inf"))
    peak = scores.amax(dim=-1, keepdim=True)  # (B, H, n, 1)
    peak = torch.where(torch.isfinite(peak), peak, torch.zeros_like(peak)).detach()
    e = (scores - peak).exp()  # (B, H, n, m); 0 where masked
    total = e.sum(dim=-1, keepdim=True).clamp_min(torch.finfo(e.dtype).tiny)  # (B, H, n, 1)
    return (e @ v) / total, (total.log() + peak).squeeze(-1)


def causal_positions(n: int, world: int, *, balanced: bool = True) -> torch.Tensor:
    """(world, n) global positions of every rank's n local tokens in a causal sequence of
    ``world * n`` tokens. ``balanced`` (zigzag): cut into 2·world chunks, rank r holds chunks r
    and 2·world-1-r, so every rank has the same share of the causal triangle's work;
    otherwise contiguous chunks (rank r holds [r·n, (r+1)·n): the last rank does the most)."""
    if not balanced:
        return torch.arange(world * n).view(world, n)
    if n % 2:
        raise ValueError(
            f"balanced causal context parallelism needs an even number of tokens per rank, got "
            f"{n} (the sequence must divide into 2 x cp chunks)"
        )
    c = n // 2
    rows = [
        torch.cat(
            [
                torch.arange(r * c, (r + 1) * c),
                torch.arange((2 * world - 1 - r) * c, (2 * world - r) * c),
            ]
        )
        for r in range(world)
    ]
    return torch.stack(rows)


def ring_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    group: dist.ProcessGroup,
    *,
    sample_ids: torch.Tensor | None = None,
    overlap: bool | None = None,
    positions: torch.Tensor | None = None,
) -> torch.Tensor:
    """Exact full attention of the local queries against the K/V chunks of all ranks.

    q (B, Hq, n, d), k/v (B, Hkv, n, d) are this rank's sequence chunk; returns (B, Hq, n, d).
    Unnormalised partial results are merged in fp32 (or fp64 for fp64 inputs) by log-sum-exp
    (online softmax, Milakov & Gimelshein 2018), so the order of arrival does not matter.

    ``sample_ids`` (N,) int, the sample of every token of the *whole* packed sequence (the THD
    pack split over the ranks, ``cu_seqlens`` expanded): a token then attends only to tokens of
    its own sample, wherever along the ring they live; samples may straddle chunk boundaries.

    ``positions`` (world, n) int: causal attention (the autoregressive family): a query attends
    to keys at global positions <= its own, each rank's tokens placed as :func:`causal_positions`
    says; blocks a rank's queries cannot see at all are skipped (the ring still passes them on).

    ``overlap``: move the next K/V block (backward: the K/V gradients) while the current block is
    computed (:class:`_RingStart` / :class:`_RingWait`); False sends, waits, then computes (same
    numbers, bitwise). None (default): overlap unless the group is gloo — on CPU the ranks'
    compute already fills the cores and the measured ratio was noise around 1 (0.86-1.20x).
    """
    if overlap is None:
        overlap = dist.get_backend(group) != "gloo"
    world = dist.get_world_size(group)
    rank = dist.get_rank(group)
    n = q.shape[2]
    if sample_ids is not None and sample_ids.shape != (world * n,):
        raise ValueError(
            f"sample_ids: expected shape ({world * n},) for {world} chunks of {n} tokens, "
            f"got {tuple(sample_ids.shape)}"
        )
    rep = q.shape[1] // k.shape[1]  # GQA: K/V travel un-repeated (fewer bytes), expand locally
    acc = torch.promote_types(q.dtype, torch.float32)
    scale = 1.0 / math.sqrt(q.shape[-1])
    qf = q.to(acc)  # (B, Hq, n, d)
    out = lse = None
    moving: tuple | None = None  # (transfer, k, v buffers) of the block in flight
    for step in range(world):
        if moving is not None:
            k, v = _RingWait.apply(group, *moving)  # the block that moved meanwhile
        elif step:
            k, v = _RingShift.apply(group, k, v)  # block of rank (r - step) mod P
        moving = None
        if overlap and step + 1 < world:  # start moving the next block before computing this
            transfer = _Transfer()
            moving = (transfer, *_RingStart.apply(group, transfer, k, v))
        kb = k.repeat_interleave(rep, dim=1) if rep > 1 else k  # (B, Hq, n, d)
        vb = v.repeat_interleave(rep, dim=1) if rep > 1 else v
        mask = None
        src = (rank - step) % world
        if sample_ids is not None:
            q_ids = sample_ids[rank * n : (rank + 1) * n]
            mask = q_ids[:, None] == sample_ids[src * n : (src + 1) * n][None, :]  # (n, n)
        if positions is not None:
            seen = positions[src].to(q.device)[None, :] <= positions[rank].to(q.device)[:, None]
            mask = seen if mask is None else mask & seen  # (n, n)
            if not bool(seen.any()):  # no query here sees this block: no work, nothing to merge
                # ...but keep the block in the graph (a zero term), so the backward of every
                # ring shift runs on every rank and the P2P pairs of the backward still match
                out = out + 0.0 * (kb.sum() + vb.sum()).to(acc)
                continue
        o_blk, lse_blk = _block_attention(qf, kb.to(acc), vb.to(acc), scale, mask)
        if out is None:
            out, lse = o_blk, lse_blk
            continue
        new = torch.logaddexp(lse, lse_blk)  # (B, Hq, n)
        out = out * (lse - new).exp()[..., None] + o_blk * (lse_blk - new).exp()[..., None]
        lse = new
    return out.to(q.dtype)  # (B, Hq, n, d)


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
    sequence (``sample_ids`` (N,), full layout) uses the block-diagonal mask of the whole pack.
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
        q, k, v = (_group(t, grid, layout) for t in (q, k, v))  # (B', H/P, S, d)
    mask = None
    if sample_ids is not None:
        if sample_ids.shape != (q.shape[2],):
            raise ValueError(
                f"sample_ids: expected shape ({q.shape[2]},), got {tuple(sample_ids.shape)}"
            )
        mask = (sample_ids[:, None] == sample_ids[None, :])[None, None]  # (1, 1, N, N)
    out = attention(q, k, v, mask)  # (B', H/P, S, d)
    if layout != "full":
        out = _ungroup(out, b, grid, layout)  # (B, H/P, N, d)
    return heads_to_seq(out, group)  # (B, Hq, n, d)


def local_attention(q, k, v, *, grid: Grid) -> torch.Tensor:
    """Spatial attention of a chunk of whole frames ``grid`` = (local t, h, w): no communication."""
    b = q.shape[0]
    q, k, v = (_group(t, grid, "spatial") for t in (q, k, v))  # (B*t, H, h*w, d)
    return _ungroup(attention(q, k, v), b, grid, "spatial")  # (B, Hq, n, d)


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
            p = dist.get_world_size(group)
            pos = causal_positions(q.shape[2], p, balanced=balanced)  # (P, n)
            if sample_ids is not None:  # packed documents: ids of every rank's chunk, in order
                sample_ids = sample_ids[pos.flatten().to(sample_ids.device)]
            return ring_attention(q, k, v, group, sample_ids=sample_ids, positions=pos)
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
