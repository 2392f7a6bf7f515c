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
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch

from vfm_core.annotate.text_encoder import TEXT_RECORD
from vfm_core.checkpoints.errors import CheckpointError
from vfm_core.checkpoints.manager import CheckpointManager
from vfm_core.checkpoints.merge import merged_model
from vfm_core.checkpoints.read import read_tensors, resolve_checkpoint, saved_shapes
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
