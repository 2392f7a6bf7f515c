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

Ranks need not hold the same tensors (pipeline parallelism: each stage its own blocks, their EMA
and optimizer moments): ``state.json`` records the union of every rank's state skeleton
(:func:`merge_skeletons`; the skeletons travel as JSON bytes in tensors, never pickle), with the
optimizer's ``param_groups`` merged into one list of parameter names per group, so a checkpoint
saved under PP2 loads in one process and the other way round. On load each rank reads the subset
of the saved tensors its own state holds (:func:`restrict_skeleton`); the union of all ranks'
tensors must equal the saved set (another model otherwise).
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


def all_gather_bytes(raw: bytes) -> list[bytes]:
    """Every rank's ``raw`` in rank order, as uint8 tensors (no pickle between ranks)."""
    device = "cuda" if dist.get_backend() == "nccl" else "cpu"
    size = torch.tensor([len(raw)], dtype=torch.int64, device=device)
    sizes = [torch.zeros_like(size) for _ in range(dist.get_world_size())]
    dist.all_gather(sizes, size)
    longest = max(int(n) for n in sizes)
    buf = torch.zeros(longest, dtype=torch.uint8)
    if raw:
        buf[: len(raw)] = torch.frombuffer(bytearray(raw), dtype=torch.uint8)
    buf = buf.to(device)
    bufs = [torch.empty_like(buf) for _ in sizes]
    dist.all_gather(bufs, buf)
    return [bytes(b[: int(n)].cpu().numpy().tobytes()) for b, n in zip(bufs, sizes)]


def _ordered_union(lists: list[list]) -> list:
    seen: dict = {}
    for items in lists:
        for x in items:
            seen.setdefault(x, None)
    return list(seen)


def merge_skeletons(skeletons: list[Any], path: str = "") -> Any:
    """One skeleton holding the state of all ranks: dicts are united key by key (the first rank
    holding a key gives its order), ``optim.param_groups`` keep rank 0's hyper-parameters with
    the parameter names of all ranks (``params``, first-seen order), any other leaf is the first
    rank's (step, LR schedule, data position: equal on every rank)."""
    first = skeletons[0]
    if isinstance(first, dict) and all(isinstance(s, dict) for s in skeletons):
        keys = _ordered_union([list(s) for s in skeletons])
        return {
            k: merge_skeletons([s[k] for s in skeletons if k in s], f"{path}.{k}" if path else k)
            for k in keys
        }
    if path == "optim.param_groups":
        if len({len(s) for s in skeletons}) != 1:
            raise CheckpointError(
                f"optimizer param_groups differ in number across ranks "
                f"({sorted({len(s) for s in skeletons})}); cannot merge them"
            )
        return [
            {**groups[0], "params": _ordered_union([g["params"] for g in groups])}
            for groups in zip(*skeletons)
        ]
    return first


_DROP = object()


def restrict_skeleton(node: Any, keep: set[str]) -> Any:
    """``node`` without the tensors outside ``keep`` (dicts that held only such tensors go too):
    the part of a merged skeleton this rank's state holds. Other leaves stay."""
    if isinstance(node, dict):
        if set(node) == {"__tensor__"}:
            return node if node["__tensor__"] in keep else _DROP
        out = {k: r for k, v in node.items() if (r := restrict_skeleton(v, keep)) is not _DROP}
        return _DROP if node and not out else out
    if isinstance(node, list):
        return [r for v in node if (r := restrict_skeleton(v, keep)) is not _DROP]
    return node


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
        skeletons = [json.loads(b) for b in all_gather_bytes(json.dumps(skeleton).encode())]
        skeleton = merge_skeletons(skeletons)
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
        return _restore_int_keys(join_state(mine, buffers), template)


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
