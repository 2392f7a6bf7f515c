"""Checkpoints through torch.distributed.checkpoint (DCP): tensors in safetensors, the rest in
JSON, loadable under any other parallel layout.

Layout of ``DIR/checkpoints/step_00000010/``:

* ``model-*.safetensors`` + ``model.safetensors.index.json``: every tensor of the Stateful state
  (model, EMA, optimizer moments), written by DCP's HuggingFace storage writer. Every rank writes
  its own shards at once (``save_distributed``; replicated tensors are de-duplicated), and
  loading reads them into the *current* layout's shards, so a checkpoint saved under TP2 loads
  under FSDP2, TP2 x CP2, PP2 or one process (paper §4: resharding);
* ``state.json``: the non-tensor leaves (step, loader position, LR-schedule counters, MLflow run
  id), the model config (to refuse a resume of another model shape) and the union of every
  rank's state skeleton (:mod:`vfm_core.train.state_tree`; ranks may hold different tensors under
  pipeline parallelism). Each rank loads the subset of the saved tensors its own state holds.

No pickle: DCP's default ``.metadata`` file is a pickle, so the safetensors storage is used instead,
and ``state.json`` is plain JSON. A checkpoint is written to a temporary folder and renamed into
place by rank 0 after every rank finished, so a crash mid-save never leaves a half checkpoint
that :meth:`CheckpointManager.latest` would pick.

The same code runs with one rank or without any process group (tests, inference tools).
"""

from __future__ import annotations

import json
import shutil
import warnings
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import HuggingFaceStorageReader, HuggingFaceStorageWriter

from vfm_core.data.loader import LoaderStateError
from vfm_core.parallel.world import all_gather_bytes, barrier, is_rank0
from vfm_core.train.errors import CheckpointError
from vfm_core.train.state_tree import (
    join_state,
    merge_skeletons,
    restore_int_keys,
    restrict_skeleton,
    split_state,
    split_state_paths,
)

__all__ = ["STATE_FILE", "CheckpointError", "CheckpointManager", "load_trainer", "save_trainer"]

STATE_FILE = "state.json"
FORMAT_VERSION = 1


class CheckpointManager:
    """Saves and restores a Stateful state dict under ``root/checkpoints`` on every rank of the
    default process group (or alone); keeps the last ``keep``."""

    def __init__(self, root: str | Path, *, keep: int = 2):
        self.dir = Path(root) / "checkpoints"
        self.keep = keep

    def path(self, step: int) -> Path:
        return self.dir / f"step_{step:08d}"

    def list(self) -> list[Path]:
        if not self.dir.exists():
            return []
        return sorted(p for p in self.dir.glob("step_*") if (p / STATE_FILE).exists())

    def latest(self) -> Path | None:
        done = self.list()
        return done[-1] if done else None

    def save(self, step: int, state: dict[str, Any], *, meta: dict[str, Any]) -> Path:
        final = self.path(step)
        tmp = final.with_name(final.name + ".tmp")
        rank0 = is_rank0()
        if rank0:
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)
        barrier()
        tensors, skeleton = split_state(state)
        tensors = {k: v.detach() for k, v in tensors.items()}
        skeletons = [json.loads(b) for b in all_gather_bytes(json.dumps(skeleton).encode())]
        with warnings.catch_warnings():  # one process: DCP notes it runs without a process group
            warnings.simplefilter("ignore", UserWarning)
            writer = HuggingFaceStorageWriter(str(tmp), save_distributed=True)
            dcp.save(tensors, storage_writer=writer)
        barrier()
        if rank0:
            doc = {"format": FORMAT_VERSION, "step": step, "meta": meta,
                   "state": merge_skeletons(skeletons)}  # fmt: skip
            (tmp / STATE_FILE).write_text(json.dumps(doc, indent=1))
            shutil.rmtree(final, ignore_errors=True)
            tmp.rename(final)
            for old in self.list()[: -self.keep] if self.keep > 0 else []:
                shutil.rmtree(old, ignore_errors=True)
        barrier()
        return final

    @staticmethod
    def read_meta(path: Path) -> dict[str, Any]:
        try:
            doc = json.loads((path / STATE_FILE).read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise CheckpointError(f"checkpoint {path}: cannot read {STATE_FILE} ({e})") from None
        if doc.get("format") != FORMAT_VERSION:
            raise CheckpointError(f"checkpoint {path}: unknown format {doc.get('format')!r}")
        return doc

    def load(self, path: Path, template: dict[str, Any]) -> dict[str, Any]:
        """Load into tensors shaped (and sharded) like ``template``, the live state dict (call
        :func:`init_optimizer_state` before taking it); returns this rank's full state."""
        doc = self.read_meta(path)
        tensors, _ = split_state(template)
        skeleton = doc["state"]
        saved_paths = set(split_state_paths(skeleton))
        # all ranks together must hold exactly the saved tensors; each reads its own subset
        everyone: set[str] = set()
        for raw in all_gather_bytes(json.dumps(sorted(tensors)).encode()):
            everyone.update(json.loads(raw))
        missing, extra = everyone - saved_paths, saved_paths - everyone
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
        mine = restrict_skeleton(skeleton, set(tensors))
        return restore_int_keys(join_state(mine, buffers), template)


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


def save_trainer(ckpt: CheckpointManager, trainer, *, meta: dict[str, Any] | None = None) -> Path:
    return ckpt.save(trainer.step, trainer.state_dict(), meta={**trainer.meta(), **(meta or {})})


def load_trainer(ckpt: CheckpointManager, trainer, path: Path | None = None) -> Path:
    """Restore ``trainer`` (any layout) from ``path`` or the latest checkpoint."""
    path = path or ckpt.latest()
    if path is None:
        raise CheckpointError(f"--resume: no checkpoint under {ckpt.dir}")
    saved = ckpt.read_meta(path)["meta"].get("model", {})
    current = trainer.meta()["model"]
    diff = [k for k in current if saved.get(k) != current[k]]
    if diff:
        shown = ", ".join(
            f"model.{k}: checkpoint {saved.get(k)!r} vs now {current[k]!r}" for k in diff[:4]
        )
        raise CheckpointError(f"checkpoint {path} was trained with another model shape ({shown})")
    init_optimizer_state(trainer)
    try:
        trainer.load_state_dict(ckpt.load(path, trainer.state_dict()))
    except LoaderStateError as e:  # data position saved for another dataset / batch layout
        raise CheckpointError(f"checkpoint {path}: {e}") from None
    return path
