"""The training data a run reads, for ``data.source``: shards (their stored latents or token ids,
or clips encoded on the fly by the run's tokenizer, which is loaded here and handed to the shard
source: the data layer runs no network of its own), or the family's synthetic data (latents, or
token ids for the autoregressive family)."""

from __future__ import annotations

from typing import Any

from vfm_core.config import ConfigError, DataConfig, ModelConfig
from vfm_core.data.samples import LatentSource
from vfm_core.data.shard_source import ShardLatentSource
from vfm_core.families import family_of


def make_source(
    data: DataConfig, model: ModelConfig, *, sigma_data: float = 0.5, **shard_kw: Any
) -> LatentSource:
    """The source for ``data.source``, as ``model``'s family reads it; ``shard_kw`` (``dp_rank``,
    ``dp_size``, ``mp_group``) place a shard source's reads within a parallel layout."""
    family = family_of(model)
    tokenizer = None
    if data.tokenizer:  # on synthetic data too: generation decodes the run's latents with it,
        # so a wrong path or latent width is the run's error at its start, not at its end
        from vfm_core.tokenizer.io import load_tokenizer

        try:
            tokenizer = load_tokenizer(
                data.tokenizer, expected_latent_channels=family.tokenizer_channels(model)
            )
        except ValueError as e:
            raise ConfigError(f"data.tokenizer: {e}") from None
    if data.source == "shards":
        return ShardLatentSource(
            data, model, tokenizer=tokenizer, discrete=family.discrete, **shard_kw
        )
    return family.synthetic_source(data, model, sigma_data=sigma_data)
