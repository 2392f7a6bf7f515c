"""Distributed checkpoints of a ParallelTrainer, loadable under another parallel layout.

Same on-disk layout as the single-process :mod:`vfm_core.train.checkpoint` (``step_XXXXXXXX/`` with
safetensors written by DCP's HuggingFace storage writer + ``state.json``; no pickle anywhere), but
written by every rank at once: each rank saves its own shards of model, EMA and optimizer state
(``save_distributed=True``; replicated tensors are de-duplicated by DCP), rank 0 writes the JSON
and renames the finished folder. Loading reads the tensors into the *current* layout's shards, so a
checkpoint saved under TP2 loads under FSDP2, TP2 x CP2 or one process (paper §4: resharding).

The data position (``data`` in the state) is one JSON copy written by rank 0: the shard loader plans
every step globally, so all ranks hold the same state (:meth:`ParallelTrainer.state_dict` checks)
and it restores every data-parallel rank of any layout; a per-rank ``data.batch_size`` other than
the saved one is accepted between steps (:func:`vfm_core.data.shard_source.rebatch_state`).
"""

from __future__ import annotations

import json
import shutil
import warnings
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import HuggingFaceStorageReader, HuggingFaceStorageWriter

from vfm_core.data.loader import LoaderStateError
from vfm_core.train.checkpoint import (
    FORMAT_VERSION,
    STATE_FILE,
    CheckpointError,
    CheckpointManager,
    _restore_int_keys,
    join_state,
    split_state,
    split_state_paths,
)


def init_optimizer_state(trainer) -> None:
    """Create the optimizer moments (zero, weights unchanged) so a fresh trainer has every tensor
    a checkpoint holds and DCP can load them in place: one AdamW step with zero gradients and
    lr = 0."""
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


class ParallelCheckpoint(CheckpointManager):
    """:class:`CheckpointManager` whose save/load run on every rank of the default group."""

    def save(self, step: int, state: dict[str, Any], *, meta: dict[str, Any]) -> Path:
        final = self.path(step)
        tmp = final.with_name(final.name + ".tmp")
        rank0 = dist.get_rank() == 0
        if rank0:
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)
        dist.barrier()
        tensors, skeleton = split_state(state)
        tensors = {k: v.detach() for k, v in tensors.items()}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            writer = HuggingFaceStorageWriter(str(tmp), save_distributed=True)
            dcp.save(tensors, storage_writer=writer)
        dist.barrier()
        if rank0:
            doc = {"format": FORMAT_VERSION, "step": step, "meta": meta, "state": skeleton}
            (tmp / STATE_FILE).write_text(json.dumps(doc, indent=1))
            shutil.rmtree(final, ignore_errors=True)
            tmp.rename(final)
            for old in self.list()[: -self.keep] if self.keep > 0 else []:
                shutil.rmtree(old, ignore_errors=True)
        dist.barrier()
        return final

    def load(self, path: Path, template: dict[str, Any]) -> dict[str, Any]:
        """Load into tensors shaped (and sharded) like ``template``, the live state dict; call
        :func:`init_optimizer_state` before taking the template."""
        doc = self.read_meta(path)
        tensors, _ = split_state(template)
        skeleton = doc["state"]
        saved_paths = set(split_state_paths(skeleton))
        missing, extra = set(tensors) - saved_paths, saved_paths - set(tensors)
        if missing or extra:
            raise CheckpointError(
                f"checkpoint {path}: tensors do not match this trainer (missing "
                f"{sorted(missing)[:3]}, unexpected {sorted(extra)[:3]}; another model?)"
            )
        buffers = {k: torch.empty_like(v) for k, v in tensors.items()}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            try:
                dcp.load(buffers, storage_reader=HuggingFaceStorageReader(str(path)))
            except Exception as e:  # DCP wraps per-rank errors
                raise CheckpointError(f"checkpoint {path}: cannot load tensors ({e})") from None
        return _restore_int_keys(join_state(skeleton, buffers), template)


def save_trainer(ckpt: ParallelCheckpoint, trainer, *, meta: dict[str, Any] | None = None) -> Path:
    return ckpt.save(trainer.step, trainer.state_dict(), meta={**trainer.meta(), **(meta or {})})


def load_trainer(ckpt: ParallelCheckpoint, trainer, path: Path | None = None) -> Path:
    """Restore ``trainer`` (any layout) from ``path`` or the latest checkpoint."""
    path = path or ckpt.latest()
    if path is None:
        raise CheckpointError(f"no checkpoint under {ckpt.dir}")
    saved = ckpt.read_meta(path)["meta"].get("model", {})
    current = trainer.meta()["model"]
    diff = sorted(k for k in current if saved.get(k) != current[k])
    if diff:
        raise CheckpointError(
            f"checkpoint {path} was trained with another model shape (model.{diff[0]}: "
            f"checkpoint {saved.get(diff[0])!r} vs now {current[diff[0]]!r})"
        )
    init_optimizer_state(trainer)
    try:
        trainer.load_state_dict(ckpt.load(path, trainer.state_dict()))
    except LoaderStateError as e:  # data position saved for another dataset / batch layout
        raise CheckpointError(f"checkpoint {path}: {e}") from None
    return path
