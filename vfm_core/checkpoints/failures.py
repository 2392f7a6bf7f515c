"""How a failed checkpoint save or load is told in one line: the bytes a save tried to write, the
OSError behind a failure (also inside DCP's CheckpointException), a damaged checkpoint's problems
and tensors that do not match the trainer."""

from __future__ import annotations

from pathlib import Path

import torch
from torch.distributed.checkpoint import CheckpointException
from torch.distributed.tensor import DTensor

from vfm_core.checkpoints.layout import STATE_FILE


def local_bytes(t: torch.Tensor) -> int:
    """Bytes of this rank's part of ``t`` (its local shard for a DTensor)."""
    local = t.to_local() if isinstance(t, DTensor) else t
    return local.numel() * local.element_size()


def byte_size(n: int) -> str:
    """``65214000`` -> ``'65,214,000 bytes (62.2 MiB)'``."""
    scaled, unit = float(n), "B"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if scaled < 1024 or unit == "TiB":
            break
        scaled /= 1024
    return f"{n:,} bytes" if unit == "B" else f"{n:,} bytes ({scaled:.1f} {unit})"


def os_error_behind(error: BaseException) -> OSError | None:
    """The OSError behind ``error``: itself, its cause or context, or a rank's failure inside
    DCP's CheckpointException (which wraps every rank's exception)."""
    todo: list[BaseException | None] = [error]
    seen: set[int] = set()
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, OSError):
            return e
        todo += [e.__cause__, e.__context__]
        if isinstance(e, CheckpointException):
            todo += [exc for exc, _ in e.failures.values()]
    return None


def problems_line(problems: list) -> str:
    """The first of a damaged checkpoint's problems, and how many more there are."""
    more = f" (and {len(problems) - 1} more problem(s))" if len(problems) > 1 else ""
    return f"{problems[0]}{more}"


def mismatch_line(path: Path, missing: set[str], extra: set[str]) -> str:
    """One line for tensors that do not match: the optimizer's, or the model's."""
    paths = missing | extra
    if all(p.startswith("optim.") for p in paths):

        def kinds(ps):
            return sorted({p.rsplit(".", 1)[-1] for p in ps})

        return (
            f"checkpoint {path}: {STATE_FILE}: optimizer state of another optimizer (saved "
            f"{kinds(extra) or 'none'}, this trainer's optimizer holds {kinds(missing) or 'none'})"
        )
    return (
        f"checkpoint {path}: {STATE_FILE}: tensors do not match this trainer (missing "
        f"{sorted(missing)[:3]}, unexpected {sorted(extra)[:3]}; another model?)"
    )
