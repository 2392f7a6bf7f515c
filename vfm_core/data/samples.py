"""Sample and batch types that flow from data sources into the trainer."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import torch


@dataclass(kw_only=True, slots=True)
class LatentBatch:
    """One training batch of tokenizer latents with their caption embeddings."""

    latents: torch.Tensor
    """(B, C, T, H, W) latents, already scaled to ~sigma_data std."""
    text: torch.Tensor
    """(B, L, Dt) caption text embeddings."""
    keys: list[str]
    """Sample keys, for lineage and debugging."""

    def to(self, device: torch.device | str) -> LatentBatch:
        return LatentBatch(
            latents=self.latents.to(device), text=self.text.to(device), keys=self.keys
        )


@dataclass(kw_only=True, slots=True)
class LatentPack:
    """One pack: samples of their own latent sizes that share one token sequence."""

    latents: list[torch.Tensor]
    """[(C, T_s, H_s, W_s)] latents of the S samples, each a multiple of the patch."""
    text: torch.Tensor
    """(S, L, Dt) caption embeddings, zero padded to L."""
    text_lengths: torch.Tensor
    """(S,) int64 valid caption tokens of every sample (1..L)."""
    keys: list[str]
    """Sample keys, in pack order."""
    positions: list[int]
    """Global loader positions of the samples (unique per run: keys of counter-based draws; in a
    blend offset by dataset, :data:`~vfm_core.data.blend.POSITION_STRIDE`)."""
    length: int
    """Padded token length of the pack (``data.max_tokens``)."""


@dataclass(kw_only=True, slots=True)
class PackedLatentBatch:
    """One training step of packs (``data.max_tokens > 0``)."""

    packs: list[LatentPack]
    """Packs of this step (this data-parallel rank's with the shard loader)."""

    @property
    def keys(self) -> list[str]:
        return [k for p in self.packs for k in p.keys]

    @property
    def n_samples(self) -> int:
        return sum(len(p.keys) for p in self.packs)


@runtime_checkable
class LatentSource(Protocol):
    """A savable, deterministic stream of :class:`LatentBatch`: same state, same batches.

    ``state_dict`` returns a small JSON-serialisable dict; ``load_state_dict`` restores it exactly.
    """

    def next_batch(self) -> LatentBatch | PackedLatentBatch: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...
