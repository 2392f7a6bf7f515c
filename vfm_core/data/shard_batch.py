"""What the shard loader hands out: :class:`Sample` and :class:`Batch` (``batch.keys`` or
``batch["keys"]``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from vfm_core.geometry import Grid, PackLayout


@dataclass(kw_only=True, slots=True)
class Sample:
    """One loaded sample."""

    key: str
    position: int
    """Global position in the sample order (epoch * N + slot)."""
    index: int
    """Row of the sample in the dataset index."""
    meta: dict[str, Any]
    txt_emb: np.ndarray
    """(L, D) float32 caption embedding."""
    grid: Grid
    """Latent token grid (t, h, w) after tokenizer and patchify, from the index."""
    frames: np.ndarray | None = None
    """(T, H, W, 3) uint8 decoded clip (``decode="frames"``)."""
    mp4: bytes | None = None
    """Encoded clip (``decode="none"``)."""
    latent: np.ndarray | None = None
    """(C, T, H, W) float32 latents when the shard has them."""
    bucket: tuple[int, int, int] | None = None
    """(height, width, frames) training shape when bucketing (crop/resize target)."""


@dataclass(kw_only=True, slots=True)
class Batch:
    """What one step of one rank gets. ``batch.keys`` or ``batch["keys"]``."""

    keys: list[str]
    samples: list[Sample]
    packs: list[PackLayout] | None
    """One layout per pack (packed mode), each listing its samples in ``pack_members``."""
    pack_members: list[list[int]] = field(default_factory=list)
    """For every pack, indices into ``samples``."""
    step: int = 0
    skipped: list[str] = field(default_factory=list)
    """Bad samples dropped from this batch (logged, counted): their shard and key."""
    skip_reasons: list[str] = field(default_factory=list)
    """Why each of ``skipped`` was dropped (shard, key and reason), in the same order."""
    bytes_read: int = 0
    """Bytes this rank read from storage for this batch."""
    source: int = 0
    """Dataset of the batch when blending (:class:`~vfm_core.data.blend.BlendedLoader`)."""
    global_samples: int = 0
    """Samples planned for this step over all data-parallel ranks (the same on every rank)."""

    def __getitem__(self, name: str) -> Any:
        return getattr(self, name)
