"""Typed configuration of the causal 3D video tokenizer and its named presets.

A tokenizer maps ``(B, 3, 1 + t_c·k, H, W)`` pixels in [-1, 1] to ``(B, C, 1 + k, H/s, W/s)``
continuous latents, with temporal factor ``t_c`` and spatial factor ``s`` (NVIDIA Cosmos tokenizer,
https://arxiv.org/abs/2501.03575, "CV4x8x8" / "CV8x8x8": the first frame is encoded alone, then
groups of ``t_c`` frames).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from vfm_core.config import ConfigError, build_settings
from vfm_core.recipes import TOKENIZER_RECIPES

__all__ = ["TOKENIZER_PRESETS", "TokenizerConfig", "TokenizerConfigError", "get_tokenizer_config"]


class TokenizerConfigError(ConfigError):
    """A tokenizer configuration value is invalid; the message names the field (a
    :class:`~vfm_core.config.ConfigError`: the one settings dialect)."""


@dataclass(kw_only=True, slots=True)
class TokenizerConfig:
    in_channels: int = 3
    """Pixel channels of the video (RGB)."""
    latent_channels: int = 4
    """Channels C of the continuous latent (must equal the DiT's ``model.in_channels``)."""
    temporal_factor: int = 4
    """Temporal compression t_c (1, 2, 4 or 8): 1 + t_c·k frames -> 1 + k latent frames."""
    spatial_factor: int = 8
    """Spatial compression s (a power of two, e.g. 8 or 16): H x W -> H/s x W/s."""
    patch_t: int = 2
    """Causal temporal patching (space-to-depth in time, divides temporal_factor): frame 0 is
    replicated ``patch_t - 1`` times, then groups of ``patch_t`` frames become channels."""
    patch_s: int = 4
    """Spatial patching (pixel unshuffle, divides spatial_factor) before the first conv."""
    base_channels: int = 32
    """Width of the first stage; stage i has ``base_channels * channel_mult[i]``."""
    channel_mult: tuple[int, ...] = (1, 2)
    """Width multipliers: one per 2x down-sampling stage (``num_stages``) + 1 for the bottleneck."""
    shortcuts: bool = True
    """Parameter-free residual shortcuts around every re-sampling and the latent bottleneck
    (space-to-channel averaging / channel-to-space repeating, DC-AE https://arxiv.org/abs/2410.10733);
    widths must divide accordingly."""
    num_res_blocks: int = 1
    """Residual blocks per stage (encoder and decoder)."""
    norm: Literal["rms", "group"] = "rms"
    """Normalisation: RMSNorm over channels per voxel or GroupNorm per frame (never across time)."""
    norm_groups: int = 16
    """Groups of the per-frame GroupNorm (``norm='group'`` only)."""
    regulariser: Literal["none", "kl", "l2"] = "none"
    """Latent regulariser: none (deterministic AE), kl (diagonal-Gaussian posterior, the encoder
    outputs mean and log-variance; ``encode`` returns the mean) or l2 (penalty on latent norm)."""
    reg_weight: float = 1e-4
    """Weight of the regulariser in the training loss (ignored for ``none``)."""
    tile_latent_frames: int = 0
    """Default temporal tile for encode/decode in latent frames (0 = no tiling)."""
    fsq_levels: tuple[int, ...] = ()
    """Discrete tokenizer: finite-scalar-quantisation levels per latent channel (e.g. 8,8,8,5,5,5
    = 64,000 token ids; ``latent_channels`` must equal their count, regulariser none or l2 (the
    pre-quantisation latent's, :data:`vfm_core.recipes.FSQ_L2`)); empty =
    continuous latents."""

    def __post_init__(self) -> None:
        self.channel_mult = tuple(self.channel_mult)
        self.fsq_levels = tuple(int(v) for v in self.fsq_levels)
        if self.fsq_levels:
            if any(v < 2 for v in self.fsq_levels):
                raise TokenizerConfigError(f"fsq_levels must be >= 2 each, got {self.fsq_levels}")
            if self.latent_channels != len(self.fsq_levels):
                raise TokenizerConfigError(
                    f"fsq_levels {list(self.fsq_levels)} quantise {len(self.fsq_levels)} "
                    f"channels: latent_channels must be {len(self.fsq_levels)}, got "
                    f"{self.latent_channels}"
                )
            if self.regulariser == "kl":
                raise TokenizerConfigError(
                    "fsq_levels: discrete tokenizers take regulariser none or l2 (kl samples a "
                    "continuous posterior)"
                )
        s, t = self.spatial_factor, self.temporal_factor
        if s < 1 or s & (s - 1):
            raise TokenizerConfigError(f"spatial_factor must be a power of two, got {s}")
        if t not in (1, 2, 4, 8):
            raise TokenizerConfigError(f"temporal_factor must be 1, 2, 4 or 8, got {t}")
        for name, p, f in (("patch_t", self.patch_t, t), ("patch_s", self.patch_s, s)):
            if p < 1 or p & (p - 1) or f % p:
                raise TokenizerConfigError(
                    f"{name} must be a power of two dividing its factor {f}, got {p}"
                )
        if len(self.channel_mult) != self.num_stages + 1:
            raise TokenizerConfigError(
                f"channel_mult needs {self.num_stages + 1} entries (num_stages + 1: "
                f"{self.spatial_down_stages} spatial and {self.temporal_down_stages} temporal 2x "
                f"down-samplings after patching), got {len(self.channel_mult)}"
            )
        if self.norm not in ("rms", "group"):
            raise TokenizerConfigError(f"norm must be rms or group, got {self.norm!r}")
        for m in self.channel_mult if self.norm == "group" else ():
            if (self.base_channels * m) % self.norm_groups:
                raise TokenizerConfigError(
                    f"norm_groups {self.norm_groups} must divide every stage width "
                    f"(base_channels {self.base_channels} x channel_mult {m})"
                )
        if self.shortcuts:
            self._check_shortcut_widths()
        if self.latent_channels < 1 or self.in_channels < 1:
            raise TokenizerConfigError("latent_channels and in_channels must be >= 1")
        if self.regulariser not in ("none", "kl", "l2"):
            raise TokenizerConfigError(
                f"regulariser must be none, kl or l2, got {self.regulariser}"
            )
        if self.tile_latent_frames < 0:
            raise TokenizerConfigError("tile_latent_frames must be >= 0")

    def _check_shortcut_widths(self) -> None:
        w = [self.base_channels * m for m in self.channel_mult]
        for i in range(self.num_stages):
            f = (2 if i < self.temporal_down_stages else 1) * (
                4 if i < self.spatial_down_stages else 1
            )
            if (w[i] * f) % w[i + 1]:
                raise TokenizerConfigError(
                    f"shortcuts: stage {i + 1} width {w[i + 1]} must divide {w[i]}·{f} "
                    "(set channel_mult accordingly or shortcuts=false)"
                )
        out = self.latent_channels * (2 if self.regulariser == "kl" else 1)
        if w[-1] % out:
            raise TokenizerConfigError(
                f"shortcuts: bottleneck width {w[-1]} must be a multiple of the encoder output "
                f"width {out} (latent_channels, x 2 for kl)"
            )

    @property
    def spatial_down_stages(self) -> int:
        """2x spatial down-sampling convs after patching, log2(spatial_factor / patch_s)."""
        return (self.spatial_factor // self.patch_s).bit_length() - 1

    @property
    def temporal_down_stages(self) -> int:
        """2x causal temporal down-sampling convs after patching, log2(temporal_factor/patch_t)."""
        return (self.temporal_factor // self.patch_t).bit_length() - 1

    @property
    def num_stages(self) -> int:
        """Conv stages: each down-samples in space and/or time (the first ones do both)."""
        return max(self.spatial_down_stages, self.temporal_down_stages)

    @property
    def vocab_size(self) -> int:
        """Token ids of a discrete tokenizer, prod(fsq_levels); 0 for continuous latents."""
        return math.prod(self.fsq_levels) if self.fsq_levels else 0

    @property
    def compression(self) -> tuple[int, int, int]:
        """(t_c, s, s)."""
        return (self.temporal_factor, self.spatial_factor, self.spatial_factor)

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["channel_mult"] = list(self.channel_mult)
        d["fsq_levels"] = list(self.fsq_levels)
        return d

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TokenizerConfig:
        """Build from a dict with the run config's builder (:func:`~vfm_core.config.
        build_settings`): unknown keys and wrong types raise a ConfigError naming
        ``tokenizer.<key>``; invalid combinations :class:`TokenizerConfigError`."""
        return build_settings(cls, d, prefix="tokenizer")


TOKENIZER_PRESETS: dict[str, Callable[[], TokenizerConfig]] = {
    name: functools.partial(TokenizerConfig.from_dict, settings)
    for name, settings in TOKENIZER_RECIPES.items()
}
"""The presets of :data:`vfm_core.recipes.TOKENIZER_RECIPES` (the one preset registry), built
and checked by the config builder."""


def get_tokenizer_config(name: str) -> TokenizerConfig:
    """A preset by name; unknown names raise :class:`TokenizerConfigError` listing the presets."""
    try:
        return TOKENIZER_PRESETS[name]()
    except KeyError:
        raise TokenizerConfigError(
            f"unknown tokenizer preset {name!r}; known: {sorted(TOKENIZER_PRESETS)}"
        ) from None
