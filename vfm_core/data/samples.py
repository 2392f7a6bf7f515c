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


@runtime_checkable
class LatentSource(Protocol):
    """A savable, deterministic stream of :class:`LatentBatch`: same state, same batches.

    ``state_dict`` returns a small JSON-serialisable dict; ``load_state_dict`` restores it exactly.
    """

    def next_batch(self) -> LatentBatch: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...
