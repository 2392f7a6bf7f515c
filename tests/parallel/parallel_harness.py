"""The one spawning harness of the parallel tests: run ``fn(rank, world, *args)`` in ``world``
processes joined by a gloo process group (file:// rendezvous, so no ports), collect what each rank
returns.

``fn`` must be a module-level function of an importable module (spawned children unpickle it by
name; pytest's sys.path travels with them). Each rank returns a JSON-serialisable value; an
exception in any rank fails the caller with that rank's traceback.
"""

from __future__ import annotations

import json
import os
import tempfile
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def _entry(rank: int, world: int, store: str, out: str, fn: Callable, args: tuple) -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    try:
        result = fn(rank, world, *args)
        Path(out, f"rank{rank}.json").write_text(json.dumps(result))
    except BaseException:
        Path(out, f"rank{rank}.err").write_text(traceback.format_exc())
        raise
    finally:
        dist.destroy_process_group()


def run_ranks(fn: Callable[..., Any], world: int, *args: Any) -> list[Any]:
    """Run ``fn`` on ``world`` gloo ranks; return the per-rank results, rank order."""
    with tempfile.TemporaryDirectory(prefix="vfm-dist-") as tmp:
        store = os.path.join(tmp, "store")
        try:
            mp.spawn(_entry, args=(world, store, tmp, fn, args), nprocs=world, join=True)
        except Exception as e:
            errs = sorted(Path(tmp).glob("rank*.err"))
            detail = "\n".join(f"--- {p.stem}\n{p.read_text()}" for p in errs)
            raise AssertionError(f"distributed run failed: {e}\n{detail}") from None
        return [json.loads(Path(tmp, f"rank{r}.json").read_text()) for r in range(world)]
