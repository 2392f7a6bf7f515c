"""Synthetic discrete video tokens for the autoregressive family: the synthetic latent source's
moving, caption-conditioned blobs, quantised by FSQ to token ids (what a discrete tokenizer gives
for real clips). Learnable (the blob's path follows its caption) and savable as one integer.

The FSQ levels have one entry per latent channel and multiply to ``model.vocab_size``
(:func:`synthetic_levels`).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from vfm_core.config import ConfigError, DataConfig, ModelConfig
from vfm_core.data.samples import TrainBatch
from vfm_core.data.synthetic_latents import SyntheticLatents
from vfm_core.recipes import TINY_FSQ_LEVELS
from vfm_core.tokenizer.fsq import FSQ

# FSQ levels by vocabulary: the FSQ paper's recommended grids, and tok-tiny-discrete's (ar-tiny)
LEVELS_BY_VOCAB = {
    math.prod(TINY_FSQ_LEVELS): TINY_FSQ_LEVELS,
    1000: (8, 5, 5, 5),
    4375: (7, 5, 5, 5, 5),
    15360: (8, 8, 8, 6, 5),
    64000: (8, 8, 8, 5, 5, 5),
}


def synthetic_levels(model: ModelConfig) -> tuple[int, ...]:
    levels = LEVELS_BY_VOCAB.get(model.vocab_size)
    if levels is None:
        raise ConfigError(
            f"model.vocab_size={model.vocab_size}: the synthetic token source quantises with "
            f"FSQ grids of {sorted(LEVELS_BY_VOCAB)} ids; pick one or train from shards of a "
            "discrete tokenizer"
        )
    return levels


class SyntheticTokens:
    """Token ids (B, T, H, W) on the latent grid ``data.latent_*`` with the captions of
    :class:`SyntheticLatents` (same seed, same classes)."""

    def __init__(self, data: DataConfig, model: ModelConfig):
        self.levels = synthetic_levels(model)
        self.latents = SyntheticLatents(
            data, _with_channels(model, len(self.levels)), sigma_data=1.0
        )
        self.fsq = FSQ(self.levels)

    @property
    def position(self) -> int:
        return self.latents.position

    def next_batch(self) -> TrainBatch:
        batch = self.latents.next_batch()  # latents (B, C, T, H, W) ~ unit scale
        z = batch.values.movedim(1, -1) * 2.0  # (B, T, H, W, C): spread over the grid
        ids = self.fsq.codes_to_indices(self.fsq(z))  # (B, T, H, W) int64
        return dataclasses.replace(batch, values=ids)

    def state_dict(self) -> dict[str, Any]:
        return self.latents.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.latents.load_state_dict(state)


def _with_channels(model: ModelConfig, channels: int) -> ModelConfig:
    return dataclasses.replace(model, in_channels=channels)
