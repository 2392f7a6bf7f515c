"""Reading a ``vfm train`` checkpoint without a trainer: where it is (:func:`resolve_checkpoint`:
a run directory, a ``step_*`` folder or a ``models:/`` URI, verified against its manifest), the
full shapes of its tensors (:func:`saved_shapes`, from the safetensors headers) and the tensors
themselves, whole, whatever layout wrote them (:func:`read_tensors`, DCP's safetensors reader in
no-dist mode). Nothing is unpickled."""

from __future__ import annotations

import json
import math
import warnings
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp
from safetensors import SafetensorError, safe_open
from torch.distributed.checkpoint import CheckpointException, HuggingFaceStorageReader

from vfm_core.checkpoints.errors import CheckpointError
from vfm_core.checkpoints.layout import STATE_FILE
from vfm_core.checkpoints.manager import CheckpointManager, dcp_error_line

__all__ = ["read_tensors", "resolve_checkpoint", "saved_shapes", "trained_params"]


def resolve_checkpoint(
    path: str | Path, *, check: bool = True, flag: str = "--checkpoint"
) -> tuple[Path, Path]:
    """(run directory, checkpoint folder) for a run directory or a ``step_*`` folder.
    ``check=False``: only the layout (cheap, for early argument checks); the folder returned
    is then the newest finished one, not yet verified. A registry URI (``models:/NAME@ALIAS``,
    ``models:/NAME/VERSION``) is first resolved to its local copy
    (:func:`vfm_core.checkpoints.uri.resolve_model_uri`). Errors name ``flag``, the option the
    path came from."""
    from vfm_core.checkpoints.uri import local_checkpoint

    local = local_checkpoint(path, flag=flag)
    if "://" in str(local):  # Path() would read s3://b/run as s3:/b/run
        raise CheckpointError(
            f"{flag} {local}: a run directory on this machine, or a registry URI "
            "models:/NAME@ALIAS | models:/NAME/VERSION (downloaded here), is expected"
        )
    p = Path(local)
    if not p.exists():
        raise CheckpointError(f"{flag} {p}: no such directory")
    if (p / STATE_FILE).is_file():  # a step folder: DIR/checkpoints/step_X
        run = p.parent.parent
        if not (run / "config.yaml").is_file():
            raise CheckpointError(
                f"{flag} {p}: no config.yaml in the run directory {run} "
                "(expected the layout written by `vfm train`)"
            )
        if not check:
            return run, p
        # verified like --resume-from: damaged weights are refused, never sampled from
        return run, CheckpointManager(run).choose(p, explicit_flag=flag)
    if not (p / "config.yaml").is_file():
        raise CheckpointError(
            f"{flag} {p}: not a `vfm train` run directory (no config.yaml and no "
            f"{STATE_FILE}); a tokenizer directory goes to --tokenizer"
        )
    ckpt = CheckpointManager(p)
    if not check:
        latest = ckpt.latest()
        if latest is None:
            raise CheckpointError(f"{flag} {p}: the run has no finished checkpoint yet")
        return p, latest
    # the newest intact checkpoint, like --resume: a damaged one is skipped with a warning line
    return p, ckpt.choose(flag=flag)


def saved_shapes(ckpt: Path) -> dict[str, tuple[int, ...]]:
    """Tensor name -> full shape from the safetensors headers (sharded tensors: the union)."""
    shapes: dict[str, tuple[int, ...]] = {}
    files = sorted(ckpt.glob("*.safetensors"))
    if not files:
        raise CheckpointError(f"checkpoint {ckpt}: no *.safetensors files")
    for f in files:
        try:
            with safe_open(str(f), framework="pt") as st:
                meta = st.metadata() or {}
                info = json.loads(meta.get("DCP_SHARDING_INFO", "{}"))
                for name in st.keys():
                    shape = tuple(st.get_slice(name).get_shape())
                    offs = info.get(name, {}).get("saved_offsets") or [0] * len(shape)
                    full = tuple(o + s for o, s in zip(offs, shape))
                    old = shapes.get(name, full)
                    shapes[name] = tuple(max(a, b) for a, b in zip(old, full))
        except (OSError, ValueError, SafetensorError) as e:  # JSONDecodeError: a ValueError
            raise CheckpointError(f"checkpoint {ckpt}: cannot read {f.name} ({e})") from None
    return shapes


def read_tensors(
    ckpt: Path, shapes: dict[str, tuple[int, ...]], *, prefix: str
) -> dict[str, torch.Tensor]:
    """The tensors ``prefix.NAME`` of ``shapes`` from one checkpoint folder, whole (any layout
    it was saved under), by NAME; one process, no process group."""
    buffers = {f"{prefix}.{k}": torch.empty(s) for k, s in shapes.items()}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        try:
            dcp.load(buffers, storage_reader=HuggingFaceStorageReader(str(ckpt)), no_dist=True)
        except (Exception, CheckpointException) as e:  # CheckpointException: BaseException
            raise CheckpointError(
                f"checkpoint {ckpt}: cannot load tensors ({dcp_error_line(e)})"
            ) from None
    return {k.removeprefix(f"{prefix}."): v for k, v in buffers.items()}


def trained_params(checkpoint: str | Path) -> int:
    """Parameters the weights of a run (its newest intact checkpoint) or of a ``step_*`` folder
    hold: every parameter of a full run, only what trained of a LoRA / partly frozen one."""
    _, ckpt = resolve_checkpoint(checkpoint)
    return sum(math.prod(s) for k, s in saved_shapes(ckpt).items() if k.startswith("model."))
