"""Checkpoints through torch.distributed.checkpoint (DCP) — tensors in safetensors, the rest in
JSON.

Layout of ``DIR/checkpoints/step_00000010/``:

* ``model-*.safetensors`` + ``model.safetensors.index.json`` — every tensor of the Stateful state
  (model, EMA, optimizer moments, RNG bytes), written by DCP's HuggingFace storage writer, so a
  later
  parallel layout can reshard them on load;
* ``state.json`` — the non-tensor leaves (step, loader position, LR-schedule counters, MLflow run
id)
  and the model config used to check that a resume matches the model shape.

No pickle: DCP's default ``.metadata`` file is a pickle, so the safetensors storage is used instead,
and ``state.json`` is plain JSON. A checkpoint is written to a temporary folder and renamed into
place,
so a crash mid-save never leaves a half checkpoint that ``latest`` would pick.
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

STATE_FILE = "state.json"
FORMAT_VERSION = 1


class CheckpointError(RuntimeError):
    """A checkpoint is missing, unreadable or does not fit the model being trained."""


def split_state(tree: Any, prefix: str = "") -> tuple[dict[str, torch.Tensor], Any]:
    """Nested state -> (flat dict of tensors by dotted path, JSON skeleton with the other leaves).

    Tensors in the skeleton are replaced by ``{"__tensor__": path}``.
    """
    tensors: dict[str, torch.Tensor] = {}

    def walk(node: Any, path: str) -> Any:
        if isinstance(node, torch.Tensor):
            tensors[path] = node
            return {"__tensor__": path}
        if isinstance(node, dict):
            return {str(k): walk(v, f"{path}.{k}" if path else str(k)) for k, v in node.items()}
        if isinstance(node, list | tuple):
            return [walk(v, f"{path}.{i}") for i, v in enumerate(node)]
        return node

    return tensors, walk(tree, prefix)


def join_state(skeleton: Any, tensors: dict[str, torch.Tensor]) -> Any:
    if isinstance(skeleton, dict):
        if set(skeleton) == {"__tensor__"}:
            return tensors[skeleton["__tensor__"]]
        return {k: join_state(v, tensors) for k, v in skeleton.items()}
    if isinstance(skeleton, list):
        return [join_state(v, tensors) for v in skeleton]
    return skeleton


def _restore_int_keys(tree: Any, like: Any) -> Any:
    """JSON turns int dict keys (optimizer param ids) into strings; take key types from ``like``."""
    if isinstance(tree, dict) and isinstance(like, dict):
        by_str = {str(k): k for k in like}
        return {
            by_str.get(k, k): _restore_int_keys(v, like.get(by_str.get(k, k)))
            for k, v in tree.items()
        }
    if isinstance(tree, list) and isinstance(like, list | tuple):
        return [
            _restore_int_keys(v, like[i] if i < len(like) else None) for i, v in enumerate(tree)
        ]
    return tree


class CheckpointManager:
    """Saves and restores a Stateful state dict under ``root/checkpoints``; keeps the last
    ``keep``."""

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
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        tensors, skeleton = split_state(state)
        tensors = {k: v.detach().contiguous() for k, v in tensors.items()}
        with warnings.catch_warnings():  # single process: DCP notes it runs without a process group
            warnings.simplefilter("ignore", UserWarning)
            dcp.save(tensors, storage_writer=HuggingFaceStorageWriter(str(tmp)))
        doc = {"format": FORMAT_VERSION, "step": step, "meta": meta, "state": skeleton}
        (tmp / STATE_FILE).write_text(json.dumps(doc, indent=1))
        shutil.rmtree(final, ignore_errors=True)
        tmp.rename(final)
        for old in self.list()[: -self.keep] if self.keep > 0 else []:
            shutil.rmtree(old, ignore_errors=True)
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
        """Load into tensors shaped like ``template`` (the live state dict); returns the full
        state."""
        doc = self.read_meta(path)
        tensors, _ = split_state(template)
        saved, skeleton = {}, doc["state"]
        saved_paths = set(split_state_paths(skeleton))
        missing = set(tensors) - saved_paths
        if missing:
            raise CheckpointError(
                f"checkpoint {path}: has no tensor for {sorted(missing)[:5]} "
                "(saved by another model?)"
            )
        buffers = {k: torch.empty_like(v) for k, v in tensors.items()}
        # tensors present in the checkpoint but absent here (e.g. optimizer state not yet created)
        # are read with their saved shapes from the safetensors headers
        extra = saved_paths - set(tensors)
        if extra:
            buffers.update(_empty_like_saved(path, extra))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            try:
                dcp.load(buffers, storage_reader=HuggingFaceStorageReader(str(path)))
            except Exception as e:  # DCP raises CheckpointException wrapping per-rank errors
                raise CheckpointError(f"checkpoint {path}: cannot load tensors ({e})") from None
        saved.update(buffers)
        return _restore_int_keys(join_state(skeleton, saved), template)


def split_state_paths(skeleton: Any) -> list[str]:
    out: list[str] = []

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            if set(node) == {"__tensor__"}:
                out.append(node["__tensor__"])
            else:
                for v in node.values():
                    walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    walk(skeleton)
    return out


def _empty_like_saved(path: Path, names: set[str]) -> dict[str, torch.Tensor]:
    from safetensors import safe_open

    out = {}
    for f in sorted(path.glob("*.safetensors")):
        with safe_open(str(f), framework="pt") as st:
            for name in set(st.keys()) & names:
                sl = st.get_slice(name)
                dtype = getattr(
                    torch,
                    {
                        "F32": "float32",
                        "F64": "float64",
                        "U8": "uint8",
                        "I64": "int64",
                        "BF16": "bfloat16",
                        "F16": "float16",
                        "I32": "int32",
                    }[sl.get_dtype()],
                )
                out[name] = torch.empty(sl.get_shape(), dtype=dtype)
    return out
