"""Load a DiT for inference from a training run directory written by ``vfm train``.

Accepted paths: the run directory (``DIR/config.yaml`` + ``DIR/checkpoints/step_*/``; the latest
checkpoint is used), one checkpoint folder ``DIR/checkpoints/step_XXXXXXXX`` (the config is read
from ``DIR/config.yaml``) or a registered version (``models:/NAME@ALIAS``,
``models:/NAME/VERSION``: downloaded once into a local cache, :mod:`vfm_core.checkpoints.uri`).
Before any tensor is read, the model section of ``config.yaml`` is compared with the one
recorded in the checkpoint's ``state.json`` and every tensor name and shape the architecture
needs is checked against the safetensors headers, so a checkpoint of another architecture is
refused with a message naming the differing fields / tensors. Tensors are read
with DCP's HuggingFace (safetensors) reader in no-dist mode, which also reassembles checkpoints
written sharded by the parallel trainer. Nothing is unpickled.
"""

from __future__ import annotations

import json
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch
import torch.distributed.checkpoint as dcp
from safetensors import SafetensorError, safe_open
from torch.distributed.checkpoint import CheckpointException, HuggingFaceStorageReader

from vfm_core.annotate.text_encoder import TEXT_RECORD
from vfm_core.checkpoints.errors import CheckpointError
from vfm_core.checkpoints.layout import STATE_FILE
from vfm_core.checkpoints.manager import CheckpointManager, dcp_error_line
from vfm_core.config import Config, ConfigError, load_yaml, model_config_mismatch, to_dict, validate
from vfm_core.families import build_model
from vfm_core.models.dit import DiT

__all__ = ["LoadedDiT", "load_dit", "read_tensors", "resolve_checkpoint", "saved_shapes"]


@dataclass(kw_only=True, slots=True)
class LoadedDiT:
    """A DiT ready for sampling and where it came from."""

    model: DiT
    """The denoiser network in eval mode (EMA or raw weights, see :func:`load_dit`)."""
    cfg: Config
    """The run's configuration (``config.yaml``)."""
    checkpoint: Path
    """The ``step_XXXXXXXX`` folder the weights came from."""
    step: int
    """Training step of that checkpoint."""
    weights: str
    """Which weights were loaded: ``"ema"`` or ``"model"``."""
    text: dict[str, Any] | None = None
    """How the training captions were encoded (``RUN/text.json``: encoder, mode, null caption);
    None for runs without one (synthetic data, older runs: pooled MiniLM, zero null)."""


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


def _check_arch(run: Path, ckpt: Path, cfg: Config, meta: dict[str, Any]) -> None:
    saved = meta.get("meta", {}).get("model")
    if not isinstance(saved, dict):
        raise CheckpointError(f"checkpoint {ckpt}: state.json records no model config")
    shown = model_config_mismatch(
        saved, to_dict(cfg.model), now_label="config", ignore=("attn_backend",)
    )
    if shown:
        raise CheckpointError(
            f"checkpoint {ckpt} holds another architecture than {run / 'config.yaml'} ({shown})"
        )


def load_dit(
    path: str | Path,
    *,
    weights: Literal["auto", "ema", "model"] = "auto",
    device: str | torch.device = "cpu",
) -> LoadedDiT:
    """Build the run's DiT and load its weights (see the module docstring).

    ``weights="auto"`` takes the EMA weights once the run has trained for three EMA horizons,
    ``3 / (1 - train.ema_decay)`` steps (3000 for 0.999), else the raw weights: the EMA still
    holds ``decay**step`` of the initialisation — 86% after 150 steps at 0.999, 37% after one
    horizon, 5% after three."""
    run, ckpt = resolve_checkpoint(path)
    try:
        cfg = validate(load_yaml(run / "config.yaml"))
    except ConfigError as e:
        raise CheckpointError(f"--checkpoint {run}: {e}") from None
    doc = CheckpointManager.read_meta(ckpt)
    _check_arch(run, ckpt, cfg, doc)
    saved = saved_shapes(ckpt)
    has_ema = any(k.startswith("ema.") for k in saved)
    if weights == "ema" and not has_ema:
        raise CheckpointError(f"checkpoint {ckpt} holds no EMA weights (train.ema_decay=0?)")
    decay = cfg.train.ema_decay
    horizon = 3.0 / (1.0 - decay) if 0 < decay < 1 else float("inf")
    step = int(doc.get("step", 0))
    use_ema = weights == "ema" or (weights == "auto" and has_ema and step >= horizon)
    prefix = "ema" if use_ema else "model"
    if (doc.get("meta") or {}).get("base"):  # what trained on a frozen base (LoRA, trainable)
        from vfm_core.checkpoints.merge import merged_model

        model = merged_model(run, ckpt, cfg, doc["meta"]["base"], prefix=prefix)
    else:
        model = build_model(cfg.model, device="meta").to_empty(device="cpu")  # filled below
        expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}
        _check_shapes(run, ckpt, cfg, saved, expected, prefix)
        model.load_state_dict(read_tensors(ckpt, expected, prefix=prefix), strict=True)
    model = model.to(device).eval().requires_grad_(False)
    return LoadedDiT(
        model=model, cfg=cfg, checkpoint=ckpt, step=step, weights=prefix, text=read_text_record(run)
    )


def _check_shapes(
    run: Path,
    ckpt: Path,
    cfg: Config,
    saved: dict[str, tuple[int, ...]],
    expected: dict[str, tuple[int, ...]],
    prefix: str,
) -> None:
    """Every tensor the architecture needs is saved under ``prefix`` with its shape."""
    missing = [k for k in expected if f"{prefix}.{k}" not in saved]
    wrong = [
        f"{k}: checkpoint {saved[f'{prefix}.{k}']} vs model {s}"
        for k, s in expected.items()
        if f"{prefix}.{k}" in saved and saved[f"{prefix}.{k}"] != s
    ]
    if missing or wrong:
        raise CheckpointError(
            f"checkpoint {ckpt} does not fit the {cfg.model.arch!r} architecture of "
            f"{run / 'config.yaml'}: {len(missing)} tensors missing (e.g. {missing[:3]}), "
            f"{len(wrong)} with another shape (e.g. {wrong[:2]})"
        )


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


def read_text_record(run: Path) -> dict[str, Any] | None:
    """``RUN/text.json`` (written by ``vfm train`` from the shards' index), or None."""
    path = Path(run) / TEXT_RECORD
    if not path.is_file():
        return None
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise CheckpointError(f"{path}: not a readable text encoder record ({e})") from None
    if not isinstance(record, dict):
        raise CheckpointError(f"{path}: expected a JSON object")
    return record
