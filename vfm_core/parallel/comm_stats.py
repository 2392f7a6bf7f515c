"""Communication accounting: count the bytes each rank sends, and the paper's per-layer volumes.

:class:`CommCounter` is a ``TorchDispatchMode`` that sees every c10d collective (FSDP2's
all-gather / reduce-scatter, DTensor's functional collectives, our P2P ring and all-to-all) and adds
the bytes this rank sends under the usual algorithms: ring all-reduce 2(p-1)/p·n, all-gather
(p-1)·n_in, reduce-scatter and all-to-all (p-1)/p·n_in, send n (receives are counted at the
sender).

:func:`ring_bytes` / :func:`alltoall_bytes` are the closed forms for one attention layer (forward
+ backward) that the ST-DiT hybrid rests on (paper §4): ring moves K and V (and their gradients)
around all P ranks (K/V twice: the backward recomputes each block); all-to-all moves q, k, v and
the output once each way.
"""

from __future__ import annotations

from collections import defaultdict

import torch
from torch.distributed import ProcessGroup
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: PLC2701

_NAMESPACES = ("c10d", "_c10d_functional")


def _group(args) -> ProcessGroup | None:
    from torch.distributed.distributed_c10d import _resolve_process_group  # noqa: PLC2701

    for a in args:
        if isinstance(a, torch.ScriptObject):
            try:
                return ProcessGroup.unbox(a)
            except Exception:  # a ScriptObject that is not a process group (e.g. options)
                continue
    for a in args:
        if isinstance(a, str) and a:
            try:
                return _resolve_process_group(a)
            except Exception:  # reduce-op names are strings too
                continue
    return None


def _alltoall_sent(name: str, args, group: ProcessGroup) -> float:
    """Bytes an all-to-all sends to the other ranks: (p-1)/p of its input with equal splits, the
    rows not kept with explicit ones (PyTorch's ring rotates K/V as an all-to-all whose only
    non-empty split goes to the next rank)."""
    if name == "alltoall_base_":  # (output, input, group, output_splits, input_splits, ...)
        data, splits = args[1], list(args[4]) if len(args) > 4 else []
    else:  # all_to_all_single(input, output_splits, input_splits, group_name)
        data, splits = args[0], list(args[2]) if len(args) > 2 else []
    p = group.size()
    if not splits or sum(splits) == 0:
        return (p - 1) / p * _nbytes(data)
    return _nbytes(data) * (1 - splits[group.rank()] / sum(splits))


def _nbytes(x) -> int:
    if isinstance(x, torch.Tensor):
        return x.numel() * x.element_size()
    if isinstance(x, list | tuple):
        return sum(_nbytes(t) for t in x)
    return 0


class CommCounter(TorchDispatchMode):
    """``with CommCounter() as c: ...`` then ``c.bytes`` (total), ``c.by_op`` (per collective)."""

    def __init__(self):
        super().__init__()
        self.by_op: dict[str, float] = defaultdict(float)

    @property
    def bytes(self) -> float:
        return sum(self.by_op.values())

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.namespace in _NAMESPACES:
            self._count(func._opname, args)
        return func(*args, **(kwargs or {}))

    def _count(self, name: str, args) -> None:
        group = _group(args)
        p = group.size() if group is not None else 1
        if p <= 1 and name not in ("send",):
            return
        if name in ("allreduce_", "all_reduce", "all_reduce_coalesced"):
            n = 2 * (p - 1) / p * _nbytes(args[0])
        elif name in ("allgather_", "allgather_coalesced_"):
            n = (p - 1) * _nbytes(args[1])
        elif name in ("_allgather_base_", "allgather_into_tensor_coalesced_"):
            n = (p - 1) * _nbytes(args[1])
        elif name in ("all_gather_into_tensor", "all_gather_into_tensor_coalesced"):
            n = (p - 1) * _nbytes(args[0])
        elif name in ("_reduce_scatter_base_", "reduce_scatter_tensor_coalesced_"):
            n = (p - 1) / p * _nbytes(args[1])
        elif name in ("reduce_scatter_tensor", "reduce_scatter_tensor_coalesced"):
            n = (p - 1) / p * _nbytes(args[0])
        elif name in ("alltoall_base_", "all_to_all_single"):
            n = _alltoall_sent(name, args, group)
        elif name == "send":
            n = _nbytes(args[0])
        elif name == "broadcast_":
            n = _nbytes(args[0])
        else:  # recv, barrier, wait_tensor, wrappers: nothing sent
            return
        self.by_op[name] += n


def ring_bytes(
    *, b: int, tokens: int, dim_kv: int, cp: int, elem: int = 2, grad_elem: int | None = None
) -> float:
    """Bytes one rank sends for one ring-attention layer, forward + backward: K and V of its chunk
    travel P-1 hops in the forward and again in the backward (each block's softmax is recomputed
    from the saved log-sum-exp instead of keeping every block), and their gradient accumulators
    (``grad_elem`` bytes per element: float32 for 16-bit inputs, float64 for float64) travel P
    hops with them until they reach their owner."""
    chunk = b * tokens // cp * dim_kv  # elements of K (or V) of one rank
    grad_elem = grad_elem if grad_elem is not None else max(elem, 4)
    return 2 * chunk * (2 * (cp - 1) * elem + cp * grad_elem)


def alltoall_bytes(*, b: int, tokens: int, dim: int, dim_kv: int, cp: int, elem: int = 2) -> float:
    """Bytes one rank sends for one all-to-all attention layer, forward + backward: q, k, v in and
    the output back, each an all-to-all keeping 1/P local; the backward mirrors it."""
    local = b * tokens // cp * elem
    per_pass = (2 * dim + 2 * dim_kv) * local * (cp - 1) / cp
    return 2 * per_pass
