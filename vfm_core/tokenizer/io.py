"""Tokenizer checkpoints in safetensors (never pickle) and a loader for external weights on disk.

Layout written by :func:`save_tokenizer` (a directory)::

    DIR/tokenizer.safetensors   every parameter + the latent_mean / latent_std buffers; the
                                safetensors metadata holds {"format": "vfm-tokenizer",
                                "version": "1", "config": <TokenizerConfig JSON>, ...}
    DIR/config.json             the same TokenizerConfig, human-readable (a sidecar)

:func:`load_external_tokenizer` reads a directory with one ``*.safetensors`` file and a
``config.json`` (TokenizerConfig fields, optionally ``latent_mean`` / ``latent_std`` lists), maps
tensor names onto this architecture and checks every name, shape and the latent channel count
before loading, so a Cosmos-style checkpoint converted to this layout can be used offline.
Nothing is ever downloaded.
"""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from torch import Tensor

from vfm_core.config import ConfigError
from vfm_core.errors import UserError
from vfm_core.tokenizer.autoencoder import CausalVideoAutoencoder
from vfm_core.tokenizer.config import TokenizerConfig

__all__ = [
    "CONFIG_FILE",
    "FORMAT",
    "WEIGHTS_FILE",
    "TokenizerLoadError",
    "load_external_tokenizer",
    "load_tokenizer",
    "save_tokenizer",
]

WEIGHTS_FILE = "tokenizer.safetensors"
CONFIG_FILE = "config.json"
FORMAT = "vfm-tokenizer"
FORMAT_VERSION = "1"
_STATS = ("latent_mean", "latent_std")

KeyMap = Mapping[str, str] | Callable[[str], str | None]
"""Tensor-name mapping for external weights: a dict of prefix replacements (the longest matching
prefix wins) or a function returning the new name (None drops the tensor)."""


class TokenizerLoadError(UserError, ValueError):
    """Tokenizer weights are missing, unreadable or do not fit the architecture; the message names
    the file, tensor or field."""


def save_tokenizer(
    model: CausalVideoAutoencoder, directory: str | Path, *, metadata: Mapping[str, str] = ()
) -> Path:
    """Write ``DIR/tokenizer.safetensors`` (+ ``config.json``) atomically; return the weights path.

    ``metadata``: extra string entries for the safetensors header (e.g. training metrics)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
    meta = {
        **dict(metadata),
        "format": FORMAT,
        "version": FORMAT_VERSION,
        "config": model.cfg.to_json(),
    }
    weights = directory / WEIGHTS_FILE
    tmp = weights.with_suffix(".safetensors.tmp")
    save_file(tensors, str(tmp), metadata=meta)
    os.replace(tmp, weights)
    tmp_cfg = directory / (CONFIG_FILE + ".tmp")
    tmp_cfg.write_text(json.dumps(model.cfg.to_dict(), indent=2, sort_keys=True) + "\n")
    os.replace(tmp_cfg, directory / CONFIG_FILE)
    return weights


def safetensors_problem(path: Path) -> str | None:
    """What is structurally wrong with the safetensors file ``path`` (None: nothing found): too
    short, a header that is not JSON, or fewer bytes than the header's tensors need (truncated).
    Reads the 8-byte length and the JSON header only."""
    size = path.stat().st_size
    if size < 8:
        return f"{size} bytes, too short for a safetensors file"
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        if n > size - 8:
            return f"truncated: {size} bytes, the header alone needs {n + 8}"
        try:
            header = json.loads(f.read(n))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            return f"the safetensors header is not valid JSON ({e})"
    ends = [
        v["data_offsets"][1]
        for k, v in header.items()
        if k != "__metadata__" and isinstance(v, dict) and "data_offsets" in v
    ]
    need = 8 + n + max(ends, default=0)
    if size < need:
        return f"truncated: {size} bytes, its header describes {need}"
    return None


def _read_safetensors(path: Path) -> tuple[dict[str, Tensor], dict[str, str]]:
    problem = safetensors_problem(path)
    if problem is not None:
        raise TokenizerLoadError(f"cannot read safetensors file {path}: {problem}")
    try:
        with safe_open(str(path), framework="pt", device="cpu") as f:
            return {k: f.get_tensor(k) for k in f.keys()}, dict(f.metadata() or {})
    except Exception as e:  # safetensors raises its own error types for corrupt headers
        raise TokenizerLoadError(f"cannot read safetensors file {path}: {e}") from e


def _check_and_load(
    model: CausalVideoAutoencoder, tensors: dict[str, Tensor], *, source: Path, strict_stats: bool
) -> None:
    """Load ``tensors`` into ``model`` after checking names and shapes (errors name the tensor)."""
    expected = model.state_dict()
    missing = sorted(set(expected) - set(tensors))
    if not strict_stats:
        missing = [k for k in missing if k not in _STATS]
    unexpected = sorted(set(tensors) - set(expected))
    if missing or unexpected:
        raise TokenizerLoadError(
            f"{source}: weights do not match the tokenizer architecture: "
            f"{len(missing)} missing (e.g. {missing[:5]}), "
            f"{len(unexpected)} unexpected (e.g. {unexpected[:5]})"
        )
    c = model.cfg.latent_channels
    for name, dim in (("encoder.conv_out.conv.weight", 0), ("decoder.conv_in.conv.weight", 1)):
        t = tensors.get(name)
        if t is not None and t.ndim == 5 and t.shape[dim] != expected[name].shape[dim]:
            have = t.shape[dim] // (2 if model.cfg.regulariser == "kl" and dim == 0 else 1)
            raise TokenizerLoadError(
                f"{source}: latent channel mismatch: tensor {name} has shape {tuple(t.shape)} "
                f"(~{have} latent channels), the config says latent_channels={c} "
                f"(expected {tuple(expected[name].shape)})"
            )
    for name, t in tensors.items():
        if t.shape != expected[name].shape:
            raise TokenizerLoadError(
                f"{source}: tensor {name} has shape {tuple(t.shape)}, the architecture expects "
                f"{tuple(expected[name].shape)}"
            )
        if not t.is_floating_point():
            raise TokenizerLoadError(f"{source}: tensor {name} has non-float dtype {t.dtype}")
    model.load_state_dict(tensors, strict=False)


def _check_latent_channels(cfg: TokenizerConfig, expected: int | None, source: Path) -> None:
    if expected is not None and cfg.latent_channels != expected:
        raise TokenizerLoadError(
            f"{source}: tokenizer has {cfg.latent_channels} latent channels, expected {expected} "
            "(the DiT's model.in_channels)"
        )


def load_tokenizer(
    path: str | Path,
    *,
    device: str | torch.device = "cpu",
    expected_latent_channels: int | None = None,
) -> CausalVideoAutoencoder:
    """Load a tokenizer written by :func:`save_tokenizer` (the directory or its safetensors file),
    in eval mode. ``expected_latent_channels``: fail clearly if the latent width differs."""
    path = Path(path)
    weights = path / WEIGHTS_FILE if path.is_dir() else path
    if not weights.is_file():
        raise TokenizerLoadError(f"tokenizer weights not found: {weights}")
    tensors, meta = _read_safetensors(weights)
    if meta.get("format") != FORMAT or "config" not in meta:
        raise TokenizerLoadError(
            f"{weights} is not a vfm tokenizer checkpoint (metadata format "
            f"{meta.get('format')!r}); use load_external_tokenizer for other weights"
        )
    try:
        cfg = TokenizerConfig.from_dict(json.loads(meta["config"]))
    except (ConfigError, json.JSONDecodeError, TypeError) as e:
        raise TokenizerLoadError(f"{weights}: bad tokenizer config in metadata: {e}") from e
    _check_latent_channels(cfg, expected_latent_channels, weights)
    model = CausalVideoAutoencoder(cfg)
    _check_and_load(model, tensors, source=weights, strict_stats=True)
    return model.to(device).eval()


def _map_name(name: str, key_map: KeyMap | None) -> str | None:
    if key_map is None:
        return name
    if callable(key_map):
        return key_map(name)
    best = max((p for p in key_map if name.startswith(p)), key=len, default=None)
    return name if best is None else key_map[best] + name[len(best) :]


def load_external_tokenizer(
    directory: str | Path,
    *,
    key_map: KeyMap | None = None,
    weights_file: str | None = None,
    config_file: str = CONFIG_FILE,
    expected_latent_channels: int | None = None,
    device: str | torch.device = "cpu",
) -> CausalVideoAutoencoder:
    """Load pretrained tokenizer weights from a local directory (no download).

    The directory holds ``config_file`` (JSON: TokenizerConfig fields, plus optional
    ``latent_mean`` / ``latent_std`` lists) and one ``*.safetensors`` file (or ``weights_file``).
    Tensor names are mapped with ``key_map`` onto this architecture's names (see
    ``CausalVideoAutoencoder(cfg).state_dict()``). Missing latent statistics default to mean 0 /
    std 1 with a warning. Raises :class:`TokenizerLoadError` for a missing directory or file, an
    unknown config key, missing/unexpected tensors, wrong shapes, or latent channels different from
    ``expected_latent_channels``.
    """
    directory = Path(directory)
    if not directory.is_dir():
        raise TokenizerLoadError(f"external tokenizer directory not found: {directory}")
    cfg_path = directory / config_file
    if not cfg_path.is_file():
        raise TokenizerLoadError(f"external tokenizer config not found: {cfg_path}")
    if weights_file is not None:
        weights = directory / weights_file
        if not weights.is_file():
            raise TokenizerLoadError(f"external tokenizer weights not found: {weights}")
    else:
        found = sorted(directory.glob("*.safetensors"))
        if len(found) != 1:
            raise TokenizerLoadError(
                f"{directory}: expected exactly one *.safetensors file, found "
                f"{[p.name for p in found]} (pass weights_file=...)"
            )
        weights = found[0]
    try:
        raw = json.loads(cfg_path.read_text())
        if not isinstance(raw, dict):
            raise TypeError("the config must be a JSON object")
        stats = {k: raw.pop(k) for k in _STATS if k in raw}
        cfg = TokenizerConfig.from_dict(raw)
    except (ConfigError, json.JSONDecodeError, TypeError) as e:
        raise TokenizerLoadError(f"{cfg_path}: bad tokenizer config: {e}") from e
    _check_latent_channels(cfg, expected_latent_channels, cfg_path)

    src, _ = _read_safetensors(weights)
    tensors: dict[str, Tensor] = {}
    for name, t in src.items():
        new = _map_name(name, key_map)
        if new is None:
            continue
        if new in tensors:
            raise TokenizerLoadError(f"{weights}: key_map maps two tensors onto {new!r}")
        tensors[new] = t.float()
    for k, v in stats.items():
        tensors.setdefault(k, torch.tensor(v, dtype=torch.float32))
    model = CausalVideoAutoencoder(cfg)
    _check_and_load(model, tensors, source=weights, strict_stats=False)
    if not all(k in tensors for k in _STATS):
        warnings.warn(
            f"{weights}: no latent statistics; using mean 0 / std 1 (compute them with "
            "vfm_core.tokenizer.compute_latent_stats)",
            stacklevel=2,
        )
    return model.to(device).eval()
