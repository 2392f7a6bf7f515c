"""A run that trained on a frozen base (LoRA adapters, ``train.trainable``) as one plain model.

Such a run's checkpoints hold only what trained and name their base in ``state.json``
(``meta.base``: the checkpoint folder its frozen weights came from, ``train.init``; or ``seed``:
the run's own initialisation). :func:`merged_model` rebuilds the network as the trainer did (the
seed's initialisation, the base's weights where they fit, the run's trained tensors), then folds
every adapter into its linear (``W + (alpha / r) B A``): the model generation, evaluation and
registration use. :func:`merge_checkpoint` (``vfm checkpoint merge``) writes it as a plain run
directory that any vfm command (and ``--init``) takes like one trained in full.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path
from typing import Any

from torch import nn

from vfm_core.annotate.text_encoder import TEXT_RECORD
from vfm_core.checkpoints.errors import CheckpointError
from vfm_core.checkpoints.manager import CheckpointManager
from vfm_core.checkpoints.read import read_tensors, resolve_checkpoint, saved_shapes
from vfm_core.config import (
    Config,
    ConfigError,
    LoraConfig,
    load_yaml,
    save_yaml,
    to_dict,
    validate,
)
from vfm_core.families import build_model
from vfm_core.models.init import init_parameters
from vfm_core.models.lora import add_adapters, merge_adapters


def merged_model(run: Path, ckpt: Path, cfg: Config, base: str, *, prefix: str) -> nn.Module:
    """The plain network of checkpoint ``ckpt`` (run ``run``, config ``cfg``) that trained on
    ``base``, with its ``prefix`` weights (``model`` or ``ema``; the EMA of a frozen parameter is
    the parameter), on the CPU."""
    model = build_model(cfg.model, device="meta")
    add_adapters(model, cfg.train.lora)
    model.to_empty(device="cpu")
    init_parameters(model, model.init_rule, seed=cfg.train.seed)  # the trainer's start
    shapes = {n: tuple(p.shape) for n, p in model.named_parameters()}
    state: dict[str, Any] = {}
    if base != "seed":
        _, base_ckpt = resolve_checkpoint(base, flag=f"checkpoint {ckpt}: its base")
        if (CheckpointManager.read_meta(base_ckpt).get("meta") or {}).get("base"):
            raise CheckpointError(
                f"checkpoint {ckpt}: its base {base_ckpt} is itself partial (merge it first)"
            )
        theirs = saved_shapes(base_ckpt)
        fits = {n: s for n, s in shapes.items() if theirs.get(f"model.{n}") == s}
        state |= read_tensors(base_ckpt, fits, prefix="model")
    own = saved_shapes(ckpt)
    trained = {n: s for n, s in shapes.items() if f"model.{n}" in own}
    if not trained:
        raise CheckpointError(f"checkpoint {ckpt} holds no tensor of its run's model")
    use = prefix if all(f"{prefix}.{n}" in own for n in trained) else "model"
    state |= read_tensors(ckpt, trained, prefix=use)
    model.load_state_dict(state, strict=False)  # the rest: the seed's initialisation
    merge_adapters(model)
    return model


@dataclasses.dataclass(kw_only=True, slots=True)
class Merged:
    """What :func:`merge_checkpoint` wrote."""

    checkpoint: Path
    """The new ``step_*`` folder."""
    source: Path
    """The partial checkpoint it merged."""
    base: str
    """The base the source trained on."""


def merge_checkpoint(src: str | Path, out: str | Path) -> Merged:
    """Write the plain model of ``src`` (a run directory or one ``step_*`` folder of a run with
    a frozen base) as run directory ``out``: ``config.yaml`` without LoRA / trainable / init,
    one checkpoint of the same step with ``model`` (and ``ema``) weights, the caption encoder
    record. ``out`` must not exist or be empty."""
    run, ckpt = resolve_checkpoint(src, flag="vfm checkpoint merge")
    doc = CheckpointManager.read_meta(ckpt)
    meta = doc.get("meta") or {}
    base = meta.get("base")
    if not base:
        raise CheckpointError(
            f"vfm checkpoint merge {src}: {ckpt} trains every parameter (no LoRA adapters, no "
            "frozen base): it is a plain model already"
        )
    dst = Path(out)
    if dst.exists() and (not dst.is_dir() or any(dst.iterdir())):
        raise CheckpointError(f"--out {dst}: exists and is not an empty directory")
    try:
        cfg = validate(load_yaml(run / "config.yaml"))
    except ConfigError as e:
        raise CheckpointError(f"vfm checkpoint merge {src}: {e}") from None
    weights = {"model": merged_model(run, ckpt, cfg, base, prefix="model").state_dict()}
    if any(k.startswith("ema.") for k in saved_shapes(ckpt)):
        weights["ema"] = merged_model(run, ckpt, cfg, base, prefix="ema").state_dict()
    train = dataclasses.replace(cfg.train, lora=LoraConfig(), trainable=(), init=None)
    plain = dataclasses.replace(cfg, train=train)
    dst.mkdir(parents=True, exist_ok=True)
    save_yaml(plain, dst / "config.yaml")
    if (run / TEXT_RECORD).is_file():
        shutil.copyfile(run / TEXT_RECORD, dst / TEXT_RECORD)
    step = int(doc.get("step", 0))
    record = {"model": to_dict(cfg.model), "recipe": cfg.recipe, "merged_from": str(ckpt)}
    record |= {"merged_base": base, "seed": cfg.train.seed}
    written = CheckpointManager(dst).save(step, {**weights, "step": step}, meta=record)
    (dst / "merge.json").write_text(json.dumps({"source": str(ckpt), "base": base}, indent=1))
    return Merged(checkpoint=written, source=ckpt, base=base)
