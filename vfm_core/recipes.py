"""Named presets (DiT-style registry): each a few lines on top of the defaults in config.py.

Big presets follow the paper's models (Cosmos-style DiT on 8×8×8-compressed latents, patch 1×2×2):
a 121-frame 704×1280 video becomes a 16×88×160 latent and 16·44·80 = 56,320 tokens.
Build them with ``build_model(cfg.model, device="meta")`` to count parameters without memory.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from vfm_core.config import (
    FAMILY_TRAITS,
    Config,
    ConfigError,
    DataConfig,
    ModelConfig,
    TrainConfig,
)

# 121 frames at 704x1280 through an 8x8x8 causal tokenizer: 1 + 120/8 = 16 latent frames
_BIG_DATA = dict(batch_size=1, latent_frames=16, latent_height=88, latent_width=160)
_BIG_MODEL = dict(
    in_channels=16,
    patch=(1, 2, 2),
    text_dim=1024,
    text_len=512,
    mlp_ratio=4.0,
    adaln="lora",
    adaln_lora_rank=256,
)
_TINY_MODEL = dict(
    in_channels=4,
    hidden=256,
    depth=4,
    heads=4,
    text_dim=384,
    text_len=8,
    adaln="lora",
    adaln_lora_rank=64,
    abs_pos=48,  # 3D RoPE alone cannot place the object or tell the first frame (measured: #14)
)


# the autoregressive family (Cosmos-AR style): Llama blocks over discrete tokens, 1 token per cell
_AR_MODEL = dict(arch="ar", patch=(1, 1, 1), norm="rms", mlp="swiglu", mlp_ratio=4.0)
# CPU: 9 frames of 64x64 through a 4x8x8 discrete tokenizer -> 3x8x8 = 192 tokens, 256 ids
_AR_TINY_DATA = dict(latent_frames=3, latent_height=8, latent_width=8)
TINY_FSQ_LEVELS = (4, 4, 4, 4)
"""FSQ levels of the CPU discrete tokenizer (tok-tiny-discrete): 256 ids, ar-tiny's vocabulary."""
# 33 frames of 640x1024 through an 8x16x16 discrete tokenizer -> 5x40x64 = 12,800 tokens
_AR_BIG_DATA = dict(batch_size=1, latent_frames=5, latent_height=40, latent_width=64)
_AR_BIG_MODEL = dict(_AR_MODEL, vocab_size=64000, text_dim=1024, text_len=512, kv_heads=8)


def _cfg(name: str, model: dict, data: dict | None = None, train: dict | None = None) -> Config:
    return Config(
        recipe=name,
        model=ModelConfig(**model),
        data=DataConfig(**(data or {})),
        train=TrainConfig(**(train or {})),
    )


RECIPES: dict[str, Callable[[], Config]] = {
    # CPU demo: ~4M params, 4x16x16 latents -> 256 tokens
    "dit-tiny": lambda: _cfg("dit-tiny", _TINY_MODEL),
    "stdit-tiny": lambda: _cfg("stdit-tiny", {**_TINY_MODEL, "arch": "stdit"}),
    "llama-dit-tiny": lambda: _cfg(
        "llama-dit-tiny",
        {**_TINY_MODEL, "arch": "llama_dit", "norm": "rms", "mlp": "swiglu", "kv_heads": 2},
    ),
    # paper scale
    "dit-7b": lambda: _cfg(
        "dit-7b", {**_BIG_MODEL, "hidden": 4096, "depth": 28, "heads": 32}, _BIG_DATA
    ),
    "dit-28b": lambda: _cfg(
        "dit-28b", {**_BIG_MODEL, "hidden": 6144, "depth": 48, "heads": 48}, _BIG_DATA
    ),
    "stdit-7b": lambda: _cfg(
        "stdit-7b",
        {**_BIG_MODEL, "arch": "stdit", "hidden": 4096, "depth": 22, "heads": 32},
        _BIG_DATA,
    ),
    "stdit-12b": lambda: _cfg(
        "stdit-12b",
        {**_BIG_MODEL, "arch": "stdit", "hidden": 5120, "depth": 24, "heads": 40},
        _BIG_DATA,
    ),
    "llama-dit-7b": lambda: _cfg(
        "llama-dit-7b",
        {
            **_BIG_MODEL,
            "arch": "llama_dit",
            "norm": "rms",
            "mlp": "swiglu",
            "hidden": 4096,
            "depth": 32,
            "heads": 32,
            "kv_heads": 8,
        },
        _BIG_DATA,
    ),
    "llama-dit-28b": lambda: _cfg(
        "llama-dit-28b",
        {
            **_BIG_MODEL,
            "arch": "llama_dit",
            "norm": "rms",
            "mlp": "swiglu",
            "hidden": 6144,
            "depth": 56,
            "heads": 48,
            "kv_heads": 8,
        },
        _BIG_DATA,
    ),
    # autoregressive: ~4M params on CPU; Cosmos-like 4B / 12B for the planner
    "ar-tiny": lambda: _cfg(
        "ar-tiny",
        {
            **_AR_MODEL,
            "vocab_size": math.prod(TINY_FSQ_LEVELS),  # tok-tiny-discrete's 256 ids
            "hidden": 256,
            "depth": 4,
            "heads": 4,
            "kv_heads": 2,
            "text_dim": 384,
            "text_len": 8,
            # an absolute position embedding beside 3D RoPE: the demo's direction read back from
            # its own first frames 23% -> 39% (the object's start depends on the caption)
            "abs_pos": 48,
        },
        _AR_TINY_DATA,
    ),
    "ar-4b": lambda: _cfg(
        "ar-4b", {**_AR_BIG_MODEL, "hidden": 4096, "depth": 16, "heads": 32}, _AR_BIG_DATA
    ),
    "ar-12b": lambda: _cfg(
        "ar-12b", {**_AR_BIG_MODEL, "hidden": 5120, "depth": 36, "heads": 32}, _AR_BIG_DATA
    ),
}


def get_recipe(name: str) -> Config:
    """A fresh Config for preset ``name``; unknown names list the known ones."""
    try:
        return RECIPES[name]()
    except KeyError:
        raise ConfigError(
            f"unknown recipe {name!r} (known: {', '.join(sorted(RECIPES))})"
        ) from None


# ------------------------------------------------------------------ tokenizer presets
# Settings of vfm_core.tokenizer.TokenizerConfig (built there by the config builder, so this
# layer names no tokenizer type). Shared by the paper-scale presets: 16 latent channels, 2x2x2
# patching, 128 base channels.
_PAPER_SCALE: dict = dict(
    latent_channels=16, patch_t=2, patch_s=2, base_channels=128, num_res_blocks=2, norm_groups=32
)
_FSQ_64K = (8, 8, 8, 5, 5, 5)
FSQ_L2: dict = {"regulariser": "l2", "reg_weight": 1e-3}
"""What a discrete tokenizer trains with: the L2 of its pre-quantisation latent. Without it the
encoder drives that latent to +-100, where tanh no longer responds and every channel sits on its
two end levels (tok-tiny-discrete on the demo sample: 2% of the codebook used, PSNR 19.6 dB, green
objects lost; with it 18%, 24.0 dB, every object's colour kept)."""
_DISCRETE: dict = {**_PAPER_SCALE, "latent_channels": 6, "shortcuts": False}

TOKENIZER_RECIPES: dict[str, dict] = {
    # CPU: 4x8x8, 4 latent channels (dit-tiny's in_channels); patch 2x4x4 then one 2x2x2 stage
    "tok-tiny": {},
    # paper scale (Cosmos CV4x8x8 / CV8x8x8, 16 channels; dit-7b/28b use 8x8x8); 2x2x2 patching
    # in front as Cosmos' Haar-wavelet step, then 2 (or 3) conv stages
    "tok-4x8x8": {**_PAPER_SCALE, "channel_mult": (1, 2, 4)},
    "tok-8x8x8": {**_PAPER_SCALE, "temporal_factor": 8, "channel_mult": (1, 2, 4)},
    "tok-8x16x16": {
        **_PAPER_SCALE,
        "temporal_factor": 8,
        "spatial_factor": 16,
        "channel_mult": (1, 2, 4, 4),
    },
    # discrete (FSQ) for the autoregressive family: CPU 4x8x8 with 4 channels 4,4,4,4 = 256
    # ids; Cosmos-like DV4x8x8 / DV8x16x16 with 6 channels 8,8,8,5,5,5 = 64,000 ids (6 does not
    # divide the bottleneck width, so no latent shortcut). The CPU grid: against 8,5,5,5 =
    # 1,000 ids on the demo sample, the same PSNR (21.5 dB), and ar-tiny over 3 training seeds:
    # prompt direction 43% -> 50%, FD 5.1x -> 6.5x lower than untrained (each id is seen ~4x as
    # often, so the object's small shifts are learnt from fewer examples)
    "tok-tiny-discrete": {"fsq_levels": TINY_FSQ_LEVELS, **FSQ_L2},
    "tok-dv4x8x8": {**_DISCRETE, "channel_mult": (1, 2, 4), "fsq_levels": _FSQ_64K},
    "tok-dv8x16x16": {
        **_DISCRETE,
        "temporal_factor": 8,
        "spatial_factor": 16,
        "channel_mult": (1, 2, 4, 4),
        "fsq_levels": _FSQ_64K,
    },
}
"""Named tokenizer presets, beside the run recipes above: the one preset registry."""


FAMILIES = tuple(FAMILY_TRAITS)
"""Model families (``diffusion``: a DiT over continuous latents, ``autoregressive``: a causal
transformer over discrete tokens), by name from :data:`vfm_core.config.FAMILY_TRAITS`."""
DEFAULT_RECIPE = {"diffusion": "dit-tiny", "autoregressive": "ar-tiny"}
"""The CPU recipe of each family (the forms' default)."""


def recipe_family(name: str) -> str:
    """``diffusion`` or ``autoregressive``: the family of preset ``name``."""
    return get_recipe(name).model.family_name


def check_family(recipe: str, family: str) -> None:
    """Raise ConfigError when ``recipe`` is not of ``family`` (a form asking for both)."""
    if family not in FAMILIES:
        raise ConfigError(f"family {family!r}: expected one of {', '.join(FAMILIES)}")
    if (actual := recipe_family(recipe)) != family:
        raise ConfigError(
            f"recipe {recipe!r} is a {actual} model, but family is {family!r} (choose a "
            f"{family} recipe such as {DEFAULT_RECIPE[family]!r}, or family {actual!r})"
        )
