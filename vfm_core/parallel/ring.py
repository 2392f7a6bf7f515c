"""Ring attention (Liu et al. 2023; paper §4 for full 3D attention) on fused kernels.

Every rank holds one chunk of q, k, v (``(B, H, n, d)``); K/V blocks travel around the ranks of
the group and each block's partial result, computed by a fused kernel that returns its
log-sum-exp (:mod:`vfm_core.models.flash`), is merged online. Autograd saves only the local q,
k, v, the merged output and its log-sum-exp; the backward passes K/V around the ring again,
recomputes each block's softmax from the saved log-sum-exp and sends the K/V gradient
accumulators along with their block until they reach its owner. Memory per rank is linear in the
sequence length: no n x n tensor is built, forward or backward.

Two implementations, one contract:

* **unpacked** (full attention, or causal over :func:`causal_positions`): PyTorch's own ring,
  ``torch.distributed.tensor.experimental._context_parallel._templated_ring_attention`` and its
  backward, with its head-tail load balancing for causal attention (the same chunks as
  :func:`causal_positions` ``balanced``) — called directly with the fused kernels of
  :mod:`vfm_core.models.flash`, because its ``context_parallel`` entry point has no sharding rule
  for the CPU kernel. Its options are a module global; :func:`_torch_options` sets them for the
  duration of one call (forward or backward).
* **packed** (``sample_ids``: THD packs whose samples straddle chunk boundaries): what PyTorch's
  ring lacks. Each block is cut into rectangles of (query run, key run) of one sample —
  full, or a causal square on the diagonal (:func:`block_rects`) — each one fused call; a
  pack's handful of samples gives a handful of calls per block.
"""

from __future__ import annotations

import contextlib
from collections import defaultdict
from collections.abc import Iterator

import torch
import torch.distributed as dist
from torch.utils.weak import WeakIdKeyDictionary

from vfm_core.models.flash import Aux, default_scale, flash_backward, flash_forward
from vfm_core.models.te_adapter import context_backend, te_context_attention

Rect = tuple[int, int, int, int, bool]
"""(query start, query end, key start, key end, causal square) of one block's visible part."""


# ------------------------------------------------------------------ token placement
def causal_positions(n: int, world: int, *, balanced: bool = True) -> torch.Tensor:
    """(world, n) global positions of every rank's n local tokens in a causal sequence of
    ``world * n`` tokens. ``balanced`` (zigzag, PyTorch's head-tail load balancing): cut into
    2·world chunks, rank r holds chunks r and 2·world-1-r, so every rank has the same share of
    the causal triangle's work; otherwise contiguous chunks (rank r holds [r·n, (r+1)·n): the
    last rank does the most)."""
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


# ------------------------------------------------------------------ point-to-point
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


def _finish(pending) -> list[torch.Tensor]:
    recv, reqs = pending
    for req in reqs:
        req.wait()
    return recv


def _pass_on(tensors: list[torch.Tensor], group: dist.ProcessGroup) -> list[torch.Tensor]:
    """Send to the next rank, receive from the previous one."""
    return _finish(_start_send_recv(tensors, group, 1))


# ------------------------------------------------------------------ unpacked: PyTorch's ring
@contextlib.contextmanager
def _torch_options(*, load_balance: bool, dtype: torch.dtype) -> Iterator[None]:
    """PyTorch's ring options for one call: head-tail load balancing for causal attention, K/V
    passed one hop at a time (``ALL_TO_ALL``: one block in flight, not the whole sequence
    gathered), merging in float32 (float64 inputs merge in float64)."""
    from torch.distributed.tensor.experimental._context_parallel import _attention as cp  # noqa: PLC2701

    opts = cp._cp_options
    before = (opts.enable_load_balance, opts.rotate_method, opts.convert_to_f32)
    opts.enable_load_balance = load_balance
    opts.rotate_method = cp._RotateMethod.ALL_TO_ALL
    opts.convert_to_f32 = dtype != torch.float64
    try:
        yield
    finally:
        opts.enable_load_balance, opts.rotate_method, opts.convert_to_f32 = before


class _BlockOp:
    """One block's kernel in the calling convention of PyTorch's templated ring (forward: (q, k,
    v, is_causal=) -> (out, lse, *aux); backward: keywords -> (dq, dk, dv))."""

    def __init__(self, scale: float):
        self.scale = scale

    def forward(self, q, k, v, *, is_causal: bool):
        out, lse, aux = flash_forward(q, k, v, causal=is_causal, scale=self.scale)
        return (out, lse, *aux)

    def backward(self, *, query, key, value, out, logsumexp, is_causal, grad_out, aux=()):
        return flash_backward(
            grad_out, query, key, value, out, logsumexp, aux, causal=is_causal, scale=self.scale
        )


class _TorchRing(torch.autograd.Function):
    """PyTorch's templated ring, forward and backward, on :mod:`vfm_core.models.flash`."""

    @staticmethod
    def forward(ctx, q, k, v, group, causal, balanced):
        from torch.distributed.tensor.experimental._context_parallel import _attention as cp  # noqa: PLC2701

        op = _BlockOp(default_scale(q))
        with _torch_options(load_balance=causal and balanced, dtype=q.dtype):
            out, lse, *aux = cp._templated_ring_attention(
                group, 2, op.forward, q, k.contiguous(), v.contiguous(), is_causal=causal
            )
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.group, ctx.causal, ctx.balanced, ctx.op, ctx.aux = group, causal, balanced, op, aux
        return out

    @staticmethod
    def backward(ctx, dout):
        from torch.distributed.tensor.experimental._context_parallel import _attention as cp  # noqa: PLC2701

        q, k, v, out, lse = ctx.saved_tensors
        with _torch_options(load_balance=ctx.causal and ctx.balanced, dtype=q.dtype):
            dq, dk, dv, *_ = cp._templated_ring_attention_backward(
                ctx.group, 2, ctx.op.backward, dout.contiguous(), "grad_out", q,
                k.contiguous(), v.contiguous(), out, lse, ctx.causal, aux=tuple(ctx.aux),
            )  # fmt: skip
        return dq, dk, dv, None, None, None


# ------------------------------------------------------------------ packed: rectangles
def _runs(ids: torch.Tensor, pos: torch.Tensor | None) -> list[tuple[int, int, int, int]]:
    """(start, end, id, first position) of the maximal runs of one id (and, with ``pos``,
    consecutive positions) in a chunk's ids (n,)."""
    cut = ids[1:] != ids[:-1]
    if pos is not None:
        cut |= pos[1:] != pos[:-1] + 1
    starts = [0, *(cut.nonzero().flatten() + 1).tolist()]
    ends = [*starts[1:], ids.numel()]
    firsts = pos[starts].tolist() if pos is not None else [0] * len(starts)
    return list(zip(starts, ends, ids[starts].tolist(), firsts, strict=True))


def _causal_rects(qs: int, qe: int, qp: int, ks: int, ke: int, kp: int) -> list[Rect]:
    """A query run at positions [qp, qp + nq) against a key run at [kp, kp + nk) of the same
    sample; a key is visible to a query at a position >= its own."""
    q_last, k_last = qp + qe - qs - 1, kp + ke - ks - 1
    rects = []
    before = min(ke - ks, max(0, qp - kp))  # keys before the first query: seen by all
    if before:
        rects.append((qs, qe, ks, ks + before, False))
    a, b = max(kp, qp), min(k_last, q_last)  # positions held by both runs
    if a <= b:
        rects.append((qs + a - qp, qs + b - qp + 1, ks + a - kp, ks + b - kp + 1, True))
        if b < q_last:  # queries after the last shared position see all of those keys
            rects.append((qs + b - qp + 1, qe, ks + a - kp, ks + b - kp + 1, False))
    return rects


def block_rects(
    q_ids: torch.Tensor,
    k_ids: torch.Tensor,
    q_pos: torch.Tensor | None = None,
    k_pos: torch.Tensor | None = None,
) -> list[Rect]:
    """The visible parts of one (query chunk, key chunk) block as rectangles: a query sees a key
    of its own sample (``ids`` (n,), (m,)) — and, causal (``pos`` given: global positions), only
    at a position <= its own. Every query of a rectangle sees at least one of its keys."""
    keys: dict[int, list[tuple[int, int, int]]] = defaultdict(list)
    for ks, ke, i, kp in _runs(k_ids, k_pos):
        keys[i].append((ks, ke, kp))
    rects: list[Rect] = []
    for qs, qe, i, qp in _runs(q_ids, q_pos):
        for ks, ke, kp in keys.get(i, ()):
            if q_pos is None:
                rects.append((qs, qe, ks, ke, False))
            else:
                rects += _causal_rects(qs, qe, qp, ks, ke, kp)
    return rects


def merge_block(out, lse, qs: int, qe: int, o: torch.Tensor, lo: torch.Tensor) -> None:
    """Fold one block's (o (B, H, r, d), lse (B, H, r)) into the accumulators' rows [qs, qe)."""
    acc_o, acc_l = out[:, :, qs:qe], lse[:, :, qs:qe]  # views
    new = torch.logaddexp(acc_l, lo)
    acc_o.mul_((acc_l - new).exp().unsqueeze(-1)).add_(o * (lo - new).exp().unsqueeze(-1))
    acc_l.copy_(new)


class _PackedRing(torch.autograd.Function):
    """Ring attention over rectangles (``rects[step]``: the block received at that step)."""

    @staticmethod
    def forward(ctx, q, k, v, group, rects, overlap):
        world, scale = dist.get_world_size(group), default_scale(q)
        acc = torch.promote_types(q.dtype, torch.float32)
        out = torch.zeros(q.shape, dtype=acc, device=q.device)  # (B, Hq, n, d)
        lse = torch.full(q.shape[:3], float("-inf"), dtype=acc, device=q.device)  # (B, Hq, n)
        aux: list[list[Aux]] = []
        kb, vb = k, v
        for step in range(world):
            pending = _start_send_recv([kb, vb], group, 1) if overlap and step + 1 < world else None
            aux.append([])
            for qs, qe, ks, ke, causal in rects[step]:
                o, lo, a = flash_forward(
                    q[:, :, qs:qe], kb[:, :, ks:ke], vb[:, :, ks:ke], causal=causal, scale=scale
                )
                merge_block(out, lse, qs, qe, o.to(acc), lo.to(acc))
                aux[-1].append(a)
            if step + 1 < world:
                kb, vb = _finish(pending) if pending else _pass_on([kb, vb], group)
        out = out.to(q.dtype)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.group, ctx.rects, ctx.aux, ctx.overlap, ctx.scale = group, rects, aux, overlap, scale
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse = ctx.saved_tensors
        group, world = ctx.group, dist.get_world_size(ctx.group)
        acc = lse.dtype
        dout = dout.contiguous()
        dq = torch.zeros(q.shape, dtype=acc, device=q.device)
        dk = torch.zeros(k.shape, dtype=acc, device=k.device)  # travels with its block
        dv = torch.zeros(v.shape, dtype=acc, device=v.device)
        kb, vb = k, v
        for step in range(world):
            more = step + 1 < world
            pending = _start_send_recv([kb, vb], group, 1) if ctx.overlap and more else None
            for (qs, qe, ks, ke, causal), a in zip(ctx.rects[step], ctx.aux[step], strict=True):
                gq, gk, gv = flash_backward(
                    dout[:, :, qs:qe], q[:, :, qs:qe], kb[:, :, ks:ke], vb[:, :, ks:ke],
                    out[:, :, qs:qe], lse[:, :, qs:qe].contiguous(), a,
                    causal=causal, scale=ctx.scale,
                )  # fmt: skip
                dq[:, :, qs:qe] += gq
                dk[:, :, ks:ke] += gk
                dv[:, :, ks:ke] += gv
            if more:
                kb, vb = _finish(pending) if pending else _pass_on([kb, vb], group)
            dk, dv = _pass_on([dk, dv], group)  # after the last step: home, complete
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), None, None, None


# ------------------------------------------------------------------ entry point
def ring_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    group: dist.ProcessGroup,
    *,
    sample_ids: torch.Tensor | None = None,
    causal: bool = False,
    balanced: bool = True,
    overlap: bool | None = None,
    backend: str = "sdpa",
) -> torch.Tensor:
    """Exact attention of the local queries against the K/V chunks of all ranks of ``group``.

    q (B, Hq, n, d), k/v (B, Hkv, n, d) are this rank's chunk (Hq % Hkv == 0: K/V travel with
    their own heads); returns (B, Hq, n, d). Partial results merge in float32 (float64 for
    float64 inputs), so the order of arrival does not matter.

    ``causal`` (the autoregressive family): a query attends to keys at global positions <= its
    own, every rank's tokens placed as :func:`causal_positions` (``balanced``) says.

    ``sample_ids`` (world·n,) int, the sample of every token of the *whole* packed sequence in
    rank-chunk order (the THD pack split over the ranks, ``cu_seqlens`` expanded): a token then
    attends only to tokens of its own sample, wherever along the ring they live.

    ``overlap`` (packed ring): move the next K/V block while the current one is computed; None
    (default): unless the group is gloo (on CPU the ranks' compute already fills the cores).
    PyTorch's ring (unpacked) always issues its transfers asynchronously. With the ``te``
    attention ``backend`` (the kernel of the attention core this ring replaces) on a GPU,
    unpacked calls run TransformerEngine's own context-parallel attention
    (:func:`~vfm_core.models.te_adapter.context_backend`).
    """
    world, rank, n = dist.get_world_size(group), dist.get_rank(group), q.shape[2]
    if sample_ids is None:
        if causal:
            causal_positions(n, world, balanced=balanced)  # checks the chunk divides
        impl, _ = context_backend(
            q, backend=backend, packed=False, causal=causal, balanced=balanced
        )
        if impl == "te":
            return te_context_attention(q, k, v, group, causal=causal)
        return _TorchRing.apply(q, k, v, group, causal, balanced)
    if sample_ids.shape != (world * n,):
        raise ValueError(
            f"sample_ids: expected shape ({world * n},) for {world} chunks of {n} tokens, "
            f"got {tuple(sample_ids.shape)}"
        )
    if overlap is None:
        overlap = dist.get_backend(group) != "gloo"
    key = (world, rank, causal, balanced)
    plans = _rects.setdefault(sample_ids, {})  # a pack's ids serve every layer of the step
    if key not in plans:
        ids = sample_ids.cpu().view(world, n)
        pos = causal_positions(n, world, balanced=balanced) if causal else None
        plans[key] = []
        for step in range(world):
            src = (rank - step) % world
            q_pos, k_pos = (pos[rank], pos[src]) if pos is not None else (None, None)
            plans[key].append(block_rects(ids[rank], ids[src], q_pos, k_pos))
    return _PackedRing.apply(q, k, v, group, plans[key], overlap)


_rects: WeakIdKeyDictionary = WeakIdKeyDictionary()
"""Every ring step's rectangles per sample-ids tensor (read on the host once per pack)."""
