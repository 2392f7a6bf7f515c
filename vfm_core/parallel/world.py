"""The process group every training run lives in — one process is the world-size-1 case.

:func:`init_world` joins the group torchrun describes (``RANK`` / ``WORLD_SIZE`` /
``MASTER_ADDR`` in the environment, single- or multi-node) or, in a plain process, creates a
world of one rank over an in-memory store. The trainer then runs the same code whatever the
size: collectives over one rank are identities, so a 1-process run is not a special case.

Also the two byte-level collectives the entry point and the checkpoint manager use to share
small JSON between ranks (uint8 tensors: nothing is ever pickled between ranks).
"""

from __future__ import annotations

import atexit
import logging
import os
import sys
from datetime import timedelta
from typing import NoReturn

import torch
import torch.distributed as dist


def exit_process(code: int) -> NoReturn:
    """End a process that used a gloo process group, skipping interpreter finalisation.

    Gloo's worker threads may still drop completed works (a barrier keeps the works before it,
    which keep their tensors) after ``destroy_process_group`` returned. If the interpreter is
    being finalised at that moment, the tensor's Python decref cannot take the GIL, the thread
    unwinds through C++ and the process dies with SIGABRT ("terminate called without an active
    exception") after a successful run: measured here in about 1 of 10-40 two-rank runs, the
    same race as pytorch/pytorch#179291. So the atexit handlers run while the interpreter is
    whole, output and logging are flushed, and the process leaves with ``os._exit``.
    """
    atexit._run_exitfuncs()
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


def backend_for(device: torch.device) -> str:
    return "nccl" if device.type == "cuda" else "gloo"


def init_world(device: torch.device, *, timeout_s: float = 600.0) -> bool:
    """Join (or create) the default process group for ``device``; True when this call created
    it (the caller then destroys it at the end). Under torchrun the group spans its ranks; in a
    plain process it is one rank over a :class:`~torch.distributed.HashStore`."""
    if dist.is_initialized():
        return False
    if device.type == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    timeout = timedelta(seconds=timeout_s)
    env = os.environ
    if env.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
        # torchrun's agent keeps one store across restarts; keys of an earlier attempt (the old
        # ranks' gloo / nccl addresses) would be read by the restarted ranks, which then hang, so
        # every attempt gets its own prefix
        store = dist.PrefixStore(
            f"vfm/attempt_{env.get('TORCHELASTIC_RESTART_COUNT', '0')}",
            dist.TCPStore(
                env["MASTER_ADDR"], int(env["MASTER_PORT"]), is_master=False, timeout=timeout
            ),
        )
        dist.init_process_group(
            backend_for(device),
            store=store,
            rank=int(env["RANK"]),
            world_size=int(env["WORLD_SIZE"]),
            timeout=timeout,
        )
    elif "WORLD_SIZE" in env and "MASTER_ADDR" in env:
        dist.init_process_group(backend_for(device), timeout=timeout)
    else:
        dist.init_process_group(
            backend_for(device), store=dist.HashStore(), rank=0, world_size=1, timeout=timeout
        )
    return True


def _device() -> str:
    return "cuda" if dist.get_backend() == "nccl" else "cpu"


def all_gather_bytes(raw: bytes) -> list[bytes]:
    """Every rank's ``raw`` in rank order (just ``[raw]`` without a process group)."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return [raw]
    size = torch.tensor([len(raw)], dtype=torch.int64, device=_device())
    sizes = [torch.zeros_like(size) for _ in range(dist.get_world_size())]
    dist.all_gather(sizes, size)
    longest = max(int(n) for n in sizes)
    buf = torch.zeros(longest, dtype=torch.uint8)
    if raw:
        buf[: len(raw)] = torch.frombuffer(bytearray(raw), dtype=torch.uint8)
    buf = buf.to(_device())
    bufs = [torch.empty_like(buf) for _ in sizes]
    dist.all_gather(bufs, buf)
    return [bytes(b[: int(n)].cpu().numpy().tobytes()) for b, n in zip(bufs, sizes)]


def broadcast_str(text: str) -> str:
    """Rank 0's ``text`` on every rank."""
    return all_gather_bytes(text.encode() if dist.get_rank() == 0 else b"")[0].decode()


def barrier() -> None:
    """``dist.barrier`` when there is more than one rank."""
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier()


def is_rank0() -> bool:
    return not dist.is_initialized() or dist.get_rank() == 0


def local_tensor(t: torch.Tensor) -> torch.Tensor:
    """This rank's piece of ``t``: a DTensor's local shard, a plain tensor itself."""
    from torch.distributed.tensor import DTensor

    return t.to_local() if isinstance(t, DTensor) else t
