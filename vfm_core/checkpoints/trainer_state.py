"""Checkpointing a trainer: :func:`save_trainer`, :func:`load_trainer` (which refuses a checkpoint
of another model shape or data position in one line) and :func:`init_optimizer_state`, on top of
:class:`~vfm_core.checkpoints.manager.CheckpointManager`."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from vfm_core.checkpoints.errors import CheckpointError
from vfm_core.checkpoints.layout import STATE_FILE
from vfm_core.config import model_config_mismatch
from vfm_core.data.loader import LoaderStateError

if TYPE_CHECKING:
    from vfm_core.checkpoints.manager import CheckpointManager


def init_optimizer_state(trainer) -> None:
    """Create the optimizer moments (zero, weights unchanged) so a fresh trainer has every tensor
    a checkpoint holds and DCP can load them in place: one step with zero gradients and lr = 0."""
    opt = trainer.optimizer
    if opt.state:
        return
    lrs = [g["lr"] for g in opt.param_groups]
    for g in opt.param_groups:
        g["lr"] = 0.0
        for p in g["params"]:
            p.grad = torch.zeros_like(p)
    opt.step()
    opt.zero_grad(set_to_none=True)
    for g, lr in zip(opt.param_groups, lrs):
        g["lr"] = lr


def save_trainer(ckpt: CheckpointManager, trainer, *, meta: dict[str, Any] | None = None) -> Path:
    return ckpt.save(trainer.step, trainer.state_dict(), meta={**trainer.meta(), **(meta or {})})


def load_trainer(
    ckpt: CheckpointManager, trainer, path: Path | None = None, *, verified: bool = False
) -> Path:
    """Restore ``trainer`` (any layout) from ``path`` or the newest intact checkpoint (damaged
    ones skipped with a warning, :meth:`CheckpointManager.choose`). ``verified``: ``path`` was
    already checked against its manifest."""
    if path is None or not verified:
        path = ckpt.choose(path)
    meta = ckpt.read_meta(path)["meta"]
    shown = model_config_mismatch(meta.get("model", {}), trainer.meta()["model"], now_label="now")
    if shown:
        raise CheckpointError(
            f"checkpoint {path} ({STATE_FILE}) was trained with another model shape ({shown})"
        )
    init_optimizer_state(trainer)
    try:
        trainer.load_state_dict(ckpt.load(path, trainer.state_dict()))
    except LoaderStateError as e:  # data position saved for another dataset / batch layout
        raise CheckpointError(f"checkpoint {path}: {STATE_FILE}: data position: {e}") from e
    except (KeyError, ValueError, RuntimeError, TypeError) as e:
        if isinstance(e, CheckpointError):
            raise
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        raise CheckpointError(
            f"checkpoint {path}: {STATE_FILE}: the saved state does not fit this trainer "
            f"({type(e).__name__}: {first})"
        ) from e
    seed = trainer.cfg.train.seed
    if meta.get("seed", seed) != seed and (not dist.is_initialized() or dist.get_rank() == 0):
        print(
            f"warning: resume: train.seed: {meta['seed']} in the checkpoint, {seed} now: the "
            "step's random draws (noise, caption dropout) from step "
            f"{trainer.step + 1} differ from the ones the run would have drawn",
            file=sys.stderr,
        )
    return path
