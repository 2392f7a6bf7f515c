"""Starting a new run from a trained model: ``train.init`` (``vfm train --init SRC``).

SRC is a ``vfm train`` run directory (its newest intact checkpoint), one of its ``step_*``
folders, or a registered version ``models:/NAME@ALIAS`` | ``models:/NAME/VERSION`` (downloaded
once, :mod:`vfm_core.checkpoints.uri`). The new run takes the model's weights and EMA only; its
optimizer, learning-rate schedule, data position and step start new.

* **Settings** (:func:`with_init_settings`): the run's ``model`` section is the init model's,
  except the keys the user set; so ``--init runs/champion`` trains the champion's network
  without repeating its recipe.
* **Checks before any process starts** (:func:`check_init`): the same family, and the same
  architecture but for :data:`FREE_FIELDS` (with ``train.init_strict=false`` an architecture
  change is allowed and the overlap loads); one line each.
* **Loading into the trainer** (:func:`load_init`), under any layout: every rank asks DCP for
  its own shard of every parameter it holds, so a model saved under one layout starts a run in
  any other. Names and full shapes are compared across all ranks first: missing, unused or
  differently shaped parameters are one error listing them, or with ``init_strict=false`` a
  note of what was left new and what was not used.

Positions: the networks' position information is RoPE and fixed sin-cos features of the latent
grid, computed from the run's grid, so a run may change frames, resolution and caption length
(``model.text_len``); no parameter is sized by them.
"""

from __future__ import annotations

import json
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import CheckpointException, HuggingFaceStorageReader

from vfm_core.checkpoints.errors import CheckpointError
from vfm_core.checkpoints.manager import CheckpointManager, dcp_error_line
from vfm_core.checkpoints.read import resolve_checkpoint, saved_shapes
from vfm_core.config import (
    Config,
    ConfigError,
    load_yaml,
    merge,
    model_config_mismatch,
    nested,
    to_dict,
    validate,
)
from vfm_core.families import family_of
from vfm_core.models.lora import is_adapter
from vfm_core.parallel.world import all_gather_bytes, is_rank0, local_tensor

FLAG = "--init"
"""How the option is named in messages (``train.init`` in a config)."""
FREE_FIELDS = ("attn_backend", "text_len")
"""Model fields a run may set apart from its init model: neither sizes nor names a parameter
(the attention kernel; the caption length)."""


@dataclass(kw_only=True, slots=True)
class InitModel:
    """The model a run starts from and where it came from."""

    spec: str
    """SRC as the user gave it (a path or a ``models:/`` URI)."""
    run: Path
    """Its run directory (for a URI: the local copy)."""
    checkpoint: Path
    """The ``step_*`` folder the weights come from."""
    cfg: Config
    """Its run's config (``config.yaml``)."""
    meta: dict[str, Any]
    """What its checkpoint records besides tensors (``state.json`` ``meta``)."""

    @property
    def model(self) -> dict[str, Any]:
        """Its model section as the checkpoint records it (else as ``config.yaml`` says)."""
        saved = self.meta.get("model")
        return saved if isinstance(saved, dict) else to_dict(self.cfg.model)

    def tags(self) -> dict[str, str]:
        """MLflow lineage of a run started from it (copied to a registered version)."""
        tags = {
            "vfm.parent_model": self.spec,
            "vfm.parent_checkpoint": str(self.checkpoint.resolve()),
        }
        if self.meta.get("mlflow_run_id"):
            tags["vfm.parent_run"] = str(self.meta["mlflow_run_id"])
        return tags


def open_init(spec: str, *, check: bool = True) -> InitModel:
    """The init model ``spec`` names. ``check``: its checkpoint verified against its manifest
    (rank 0; the newest intact one of a run directory); False: the layout only (cheap, for the
    checks before a launch)."""
    run, ckpt = resolve_checkpoint(spec, check=check, flag=FLAG)
    try:
        cfg = validate(load_yaml(run / "config.yaml"))
    except ConfigError as e:
        raise CheckpointError(f"{FLAG} {spec}: {run / 'config.yaml'}: {e}") from None
    meta = CheckpointManager.read_meta(ckpt).get("meta") or {}
    if meta.get("base"):
        raise CheckpointError(
            f"{FLAG} {spec}: {ckpt} holds only what its run trained (LoRA adapters or "
            f"train.trainable) on top of {meta['base']}: write the whole model with "
            f"`vfm checkpoint merge {spec} --out DIR` and start from DIR"
        )
    return InitModel(spec=str(spec), run=run, checkpoint=ckpt, cfg=cfg, meta=meta)


def with_init_settings(cfg: Config, given: set[str] | frozenset[str]) -> Config:
    """``cfg`` with its init model's network: the init model's ``model.*`` settings, less the
    keys the user set (``given``); ``cfg`` itself without ``train.init``. A recipe of another
    family than the init model's is a CheckpointError."""
    if not cfg.train.init:
        return cfg
    init = open_init(cfg.train.init, check=False)
    refuse_other_family(init, cfg, f"recipe {cfg.recipe!r}")
    derived = {f"model.{k}": v for k, v in init.model.items() if f"model.{k}" not in given}
    return validate(merge(cfg, nested(derived)))


def check_init(cfg: Config) -> InitModel | None:
    """Refuse, in one line and before any process starts, an init model of another family or
    (unless ``train.init_strict`` is false) another architecture; None without ``train.init``."""
    if not cfg.train.init:
        return None
    init = open_init(cfg.train.init, check=False)
    refuse_other_family(init, cfg, f"model.arch {cfg.model.arch!r}")
    shown = model_config_mismatch(
        init.model, to_dict(cfg.model), now_label="this run", ignore=FREE_FIELDS
    )
    if shown and cfg.train.init_strict:
        raise CheckpointError(
            f"{FLAG} {init.spec}: another architecture ({shown}); set train.init_strict=false "
            "to load the parameters that match and start the others new"
        )
    return init


def refuse_other_family(init: InitModel, cfg: Config, what: str) -> None:
    """A CheckpointError when ``init`` is of another family than ``cfg`` (``what`` names the
    run's side)."""
    theirs, ours = family_of(init.cfg), family_of(cfg)
    if theirs is not ours:
        raise CheckpointError(
            f"{FLAG} {init.spec}: a {theirs.name} model (model.arch {init.cfg.model.arch!r}); "
            f"this run's {what} is of the {ours.name} family"
        )


def load_init(trainer: Any, init: InitModel) -> list[str]:
    """Load ``init``'s weights (and EMA) into ``trainer``'s parameters, any layout; the
    trainer's optimizer, schedule, data and step stay new. Returns the notes of a non-strict
    load (what was left new, what was not used); a strict mismatch is a CheckpointError."""
    strict = trainer.cfg.train.init_strict
    saved = saved_shapes(init.checkpoint)
    params = dict(trainer.layout.named_parameters())
    everyone: dict[str, list[int]] = {}  # every rank's parameters (pipeline stages hold a part)
    mine = {name: list(p.shape) for name, p in params.items()}
    for raw in all_gather_bytes(json.dumps(mine).encode()):
        everyone.update(json.loads(raw))
    theirs = {k.removeprefix("model."): list(s) for k, s in saved.items() if k.startswith("model.")}
    missing = sorted(n for n in everyone if n not in theirs and not is_adapter(n))  # adapters: new
    unused = sorted(n for n in theirs if n not in everyone)
    wrong = sorted(n for n in everyone if n in theirs and theirs[n] != everyone[n])
    if strict and (missing or unused or wrong):
        raise CheckpointError(
            f"{FLAG} {init.spec}: the checkpoint {init.checkpoint} does not fit this run's "
            f"model ({_differences(missing, unused, wrong, theirs, everyone)}); set "
            "train.init_strict=false to load the parameters that match"
        )
    take = [n for n in params if n in theirs and theirs[n] == mine[n]]
    ema = trainer.ema
    buffers = {f"model.{n}": torch.empty_like(params[n].detach()) for n in take}
    if ema is not None:
        buffers |= {f"ema.{n}": torch.empty_like(buffers[f"model.{n}"]) for n in take}
        buffers = {k: v for k, v in buffers.items() if k in saved}
    _read(init, buffers)
    with torch.no_grad():
        for n in take:
            local_tensor(params[n]).copy_(local_tensor(buffers[f"model.{n}"]))
        if ema is not None:
            state = ema.state_dict()
            for n in take:  # no EMA in the checkpoint (train.ema_decay=0): the weights
                state[n] = buffers.get(f"ema.{n}", params[n].detach())
            ema.load_state_dict(state)
    notes = []
    if missing or wrong:
        notes.append(f"left new: {_names(missing + wrong)}")
    if unused:
        notes.append(f"not used: {_names(unused)}")
    return notes


def start_from_init(trainer: Any) -> InitModel:
    """The run's ``train.init`` checked, verified and loaded into ``trainer``; one line on
    rank 0 says from where (and, non-strict, what was left new)."""
    cfg = trainer.cfg
    check_init(cfg)
    init = open_init(cfg.train.init, check=True)
    notes = load_init(trainer, init)
    trainer.base = str(init.checkpoint.resolve())  # where its frozen weights came from
    if is_rank0():
        step = int(init.checkpoint.name.removeprefix("step_") or 0)
        line = f"initialised from {init.spec} ({init.checkpoint}, step {step})"
        print("; ".join([line, *notes]), file=sys.stderr)
    return init


def _read(init: InitModel, buffers: dict[str, torch.Tensor]) -> None:
    """Fill ``buffers`` (this rank's shards) from the checkpoint's tensors of the same names."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        try:
            dcp.load(buffers, storage_reader=HuggingFaceStorageReader(str(init.checkpoint)))
        except (Exception, CheckpointException) as e:  # CheckpointException: BaseException
            raise CheckpointError(
                f"{FLAG} {init.spec}: {init.checkpoint}: cannot load the tensors "
                f"({dcp_error_line(e)})"
            ) from e


def _differences(
    missing: list[str],
    unused: list[str],
    wrong: list[str],
    theirs: dict[str, list[int]],
    ours: dict[str, list[int]],
) -> str:
    parts = []
    if missing:
        parts.append(f"{len(missing)} missing from the checkpoint: {_names(missing)}")
    if unused:
        parts.append(f"{len(unused)} not in this model: {_names(unused)}")
    if wrong:
        shown = ", ".join(f"{n} {tuple(theirs[n])} vs {tuple(ours[n])}" for n in wrong[:3])
        more = f" and {len(wrong) - 3} more" if len(wrong) > 3 else ""
        parts.append(f"{len(wrong)} of another shape (checkpoint vs run): {shown}{more}")
    return "; ".join(parts)


def _names(names: list[str], shown: int = 4) -> str:
    more = f" and {len(names) - shown} more" if len(names) > shown else ""
    return ", ".join(names[:shown]) + more
