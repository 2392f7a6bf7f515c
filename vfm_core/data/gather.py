"""Read-then-gather for a model-parallel group: each of k ranks read 1/k of the batch's samples
(item j on rank j % k); one all-gather of raw bytes gives every rank the whole batch.

Only bytes travel (uint8 tensors, gloo or nccl), never pickles. A failed read travels as a
negative length, so every rank of the group raises the same error instead of hanging.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from vfm_core.data.shard_reader import ShardError

_FAILED = -1


def all_gather_bytes(
    mine: list[bytes | Exception], *, n_total: int, group=None
) -> list[bytes | Exception]:
    """``mine`` holds items ``j = rank, rank + k, ...`` of ``n_total``; returns all of them."""
    rank, k = dist.get_rank(group), dist.get_world_size(group)
    per = -(-n_total // k)  # ceil: slots per rank
    lens = torch.full((per,), -2, dtype=torch.int64)  # -2: no item in this slot
    for s, item in enumerate(mine):
        lens[s] = len(item) if isinstance(item, bytes) else _FAILED
    all_lens = [torch.empty_like(lens) for _ in range(k)]
    dist.all_gather(all_lens, lens, group=group)
    sizes = [int(x.clamp(min=0).sum()) for x in all_lens]
    blob = torch.zeros(max(sizes + [1]), dtype=torch.uint8)
    flat = b"".join(x for x in mine if isinstance(x, bytes))
    if flat:
        blob[: len(flat)] = torch.frombuffer(bytearray(flat), dtype=torch.uint8)
    blobs = [torch.empty_like(blob) for _ in range(k)]
    dist.all_gather(blobs, blob, group=group)
    out: list[bytes | Exception] = [b""] * n_total
    for r in range(k):
        data, off = blobs[r].numpy().tobytes(), 0
        for s, n in enumerate(all_lens[r].tolist()):
            j = r + s * k
            if n == -2 or j >= n_total:
                continue
            if n == _FAILED:
                out[j] = ShardError(f"item {j}", f"read failed on model-parallel rank {r}")
                continue
            out[j], off = data[off : off + n], off + n
    if rank < k:  # own failures keep their full message
        for s, item in enumerate(mine):
            if isinstance(item, Exception):
                out[rank + s * k] = item
    return out
