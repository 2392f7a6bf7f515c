"""Causal 3D video tokenizer: pixels (B, 3, 1 + t_c·k, H, W) <-> latents (B, C, 1 + k, H/s, W/s).

* :mod:`~vfm_core.tokenizer.config` — :class:`TokenizerConfig` and presets (``tok-tiny``,
  ``tok-4x8x8``, ``tok-8x8x8``, ``tok-8x16x16``);
* :mod:`~vfm_core.tokenizer.causal_conv` — causal convs, per-frame norm, patching, re-sampling;
* :mod:`~vfm_core.tokenizer.autoencoder` — :class:`CausalVideoAutoencoder` (encode/decode, temporal
  tiling, latent scaling);
* :mod:`~vfm_core.tokenizer.train` — :func:`train_tokenizer`, :func:`synthetic_clips`;
* :mod:`~vfm_core.tokenizer.io` — safetensors save/load and the external-weights loader.
"""

from vfm_core.tokenizer.autoencoder import (
    AutoencoderOutput,
    CausalVideoAutoencoder,
    TokenizerShapeError,
    compute_latent_stats,
    psnr,
)
from vfm_core.tokenizer.config import (
    TOKENIZER_PRESETS,
    TokenizerConfig,
    TokenizerConfigError,
    get_tokenizer_config,
)
from vfm_core.tokenizer.io import (
    TokenizerLoadError,
    load_external_tokenizer,
    load_tokenizer,
    save_tokenizer,
)
from vfm_core.tokenizer.train import (
    TokenizerTrainMetrics,
    evaluate_psnr,
    synthetic_clips,
    train_tokenizer,
)

__all__ = [
    "TOKENIZER_PRESETS",
    "AutoencoderOutput",
    "CausalVideoAutoencoder",
    "TokenizerConfig",
    "TokenizerConfigError",
    "TokenizerLoadError",
    "TokenizerShapeError",
    "TokenizerTrainMetrics",
    "compute_latent_stats",
    "evaluate_psnr",
    "get_tokenizer_config",
    "load_external_tokenizer",
    "load_tokenizer",
    "psnr",
    "save_tokenizer",
    "synthetic_clips",
    "train_tokenizer",
]
