"""What a training run on encoded shards takes from its data: one derivation, used by the
pipeline flow, the training flow and ``vfm train`` alike.

Shards written by ``vfm encode-shards`` record, in their index's ``latents`` meta, the tokenizer
that encoded them and that their latents are normalised (unit variance); the shard writer records
the longest caption in embedding tokens (``caption_tokens``). From those and the tokenizer's own
saved config (no weights are read), :func:`dataset_settings` gives what the data forces on every
run (a run with other values cannot train on it):

=========================  ============================================================
``data.tokenizer``         the recorded tokenizer, when the run names none
``model.in_channels``      the tokenizer's latent channels (a continuous family)
``model.vocab_size``       the tokenizer's token ids, the product of its FSQ levels (a
                           discrete family)
=========================  ============================================================

and :func:`model_settings` adds what the pipeline also chooses for its own data (a run of a
recipe keeps the recipe's): ``diffusion.sigma_data`` 1.0 for normalised latents and
``model.text_len`` sized to the longest caption (at most :data:`MAX_TEXT_LEN`).

A key the user sets (config file, ``--set``, a form's settings or overrides) always wins:
:func:`vfm_core.families.data_settings.with_data_settings` fills in only the others. A blend takes
them from every dataset, which must agree. Shards or a tokenizer that cannot be read give nothing
here: the run's own loader names them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from vfm_core.tokenizer.config import TokenizerConfig, TokenizerConfigError

MAX_TEXT_LEN = 256
"""The most caption tokens ``model.text_len`` is sized to (longer captions are cut)."""


def tokenizer_config(path: str | Path) -> TokenizerConfig | None:
    """The config of the tokenizer at ``path`` from its metadata alone (no weights are read):
    the safetensors header, else its ``config.json``; None when it cannot be read that way
    (loading it then says why)."""
    from safetensors import safe_open

    from vfm_core.tokenizer.io import CONFIG_FILE, WEIGHTS_FILE

    p = Path(path)
    weights = p / WEIGHTS_FILE if p.is_dir() else p
    try:
        if weights.is_file():
            with safe_open(str(weights), framework="pt") as st:
                return TokenizerConfig.from_dict(json.loads((st.metadata() or {})["config"]))
        raw = json.loads((p / CONFIG_FILE).read_text())
        raw.pop("latent_mean", None), raw.pop("latent_std", None)
        return TokenizerConfig.from_dict(raw)
    except Exception:  # any unreadable form: the full load reports it
        return None


def tokenizer_geometry(tokenizer: str | Path) -> dict[str, int]:
    """The tokenizer's compression from its own saved config (no weights are read):
    ``temporal_factor`` t (1 + t·k frames -> 1 + k latent frames), ``spatial_factor`` s (H x W
    -> H/s x W/s), ``latent_channels`` and ``vocab_size`` (token ids of a discrete tokenizer: the
    product of its FSQ levels; 0 for a continuous one). A TokenizerConfigError names a
    tokenizer whose config cannot be read."""
    cfg = tokenizer_config(tokenizer)
    if cfg is None:
        raise TokenizerConfigError(
            f"tokenizer {tokenizer}: no readable config (tokenizer.safetensors metadata or "
            "config.json); name a tokenizer directory written by vfm tokenizer train"
        )
    return {
        "temporal_factor": cfg.temporal_factor,
        "spatial_factor": cfg.spatial_factor,
        "latent_channels": cfg.latent_channels,
        "vocab_size": cfg.vocab_size,
    }


def index_meta(root: str) -> dict[str, Any]:
    """The ``meta`` of the dataset index at ``root`` (its ``index.json`` alone: the sample table
    is not read); a DatasetIndexError names an index that cannot be read."""
    from vfm_core.data.index import read_index_document

    meta = read_index_document(root)[1].get("meta")
    return meta if isinstance(meta, dict) else {}


def caption_tokens(meta: dict[str, Any]) -> int | None:
    """The longest caption in embedding tokens of an index's ``meta`` (the shard writer's
    ``caption_tokens`` statistics, kept by the latent encoder); None when not recorded."""
    stats = meta.get("caption_tokens")
    return int(stats["max"]) if isinstance(stats, dict) and "max" in stats else None


def model_settings(
    *,
    discrete: bool,
    geometry: dict[str, int],
    caption_tokens: int | None = None,
    normalized: bool = True,
) -> dict[str, Any]:
    """The config values (dotted keys) a model of a ``discrete`` (token) or continuous family
    takes from its tokenizer's ``geometry`` (:func:`tokenizer_geometry`) and its data: the
    latent channels or the token ids, ``sigma_data`` 1 for ``normalized`` latents, ``text_len``
    sized to the longest caption (``caption_tokens``, at most :data:`MAX_TEXT_LEN`; no caption
    cut that the data does not force)."""
    settings: dict[str, Any] = {}
    if normalized:
        settings["diffusion.sigma_data"] = 1.0
    if not discrete:  # the DiT denoises the tokenizer's latents
        settings["model.in_channels"] = geometry["latent_channels"]
    elif geometry.get("vocab_size"):  # the causal model predicts the tokenizer's ids
        settings["model.vocab_size"] = geometry["vocab_size"]
    if caption_tokens:
        settings["model.text_len"] = min(int(caption_tokens), MAX_TEXT_LEN)
    return settings


def dataset_settings(root: str, *, discrete: bool, tokenizer: str = "") -> dict[str, Any]:
    """What the shards at ``root`` force on a run's model (module docstring): the latent
    channels or token ids of ``tokenizer``, or else of the one that encoded them (then also
    ``data.tokenizer``); {} when neither is known or the index or the tokenizer cannot be read
    (the run's loader names them)."""
    from vfm_core.data.index import DatasetIndexError

    try:
        meta = index_meta(root)
    except DatasetIndexError:
        return {}
    latents = meta.get("latents") if isinstance(meta.get("latents"), dict) else {}
    tok = tokenizer or str(latents.get("tokenizer") or "")
    if not tok or tokenizer_config(tok) is None:
        return {}
    geometry = tokenizer_geometry(tok)
    settings = model_settings(discrete=discrete, geometry=geometry, normalized=False)
    if not tokenizer:
        settings["data.tokenizer"] = tok
    return settings
