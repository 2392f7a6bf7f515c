"""The one batch type that flows from data sources into the trainer, and the source protocol.

A :class:`TrainBatch` is one step's samples, built once by the source (shards, or synthetic):

* unpacked: ``B`` samples of one latent grid, values stacked — diffusion latents ``(B, C, T, H,
  W)`` or token ids ``(B, T, H, W)``; ``layouts`` is None;
* packed (``data.max_tokens > 0``): ``P`` packs of samples of their own grids, each one padded
  token sequence of ``data.max_tokens`` — patch tokens ``(P, length, C*p)`` or ids ``(P,
  length)`` — with the pack's :class:`~vfm_core.geometry.PackLayout` (built by the loader's plan,
  never rebuilt) in ``layouts``.

Per sample, in both: the caption embedding (zero padded to ``model.text_len``) and its valid
length, the key, and the global loader position (the key of the counter-based draws of packs).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import torch

from vfm_core.geometry import PackLayout, unpack_tokens


@dataclass(kw_only=True, slots=True)
class TrainBatch:
    """One step's samples as the trainer consumes them (module docstring)."""

    values: torch.Tensor
    """The model's data input, rows: samples (unpacked) or packs (packed). Diffusion: (B, C, T,
    H, W) float latents (~sigma_data std); packed: (P, length, C*p) patch tokens, zero padding.
    Autoregressive: (B, T, H, W) int64 token ids; packed: (P, length), padding 0. Which one is
    not the batch's business: the objective of the run's family reads ``values``."""
    text: torch.Tensor
    """(S, L, Dt) caption embeddings of the S samples, zero padded to L = ``model.text_len``."""
    text_lengths: torch.Tensor
    """(S,) int64 valid caption tokens of every sample (1..L)."""
    keys: list[str]
    """Sample keys (S), in batch / pack order, for lineage and debugging."""
    positions: list[int]
    """Global loader positions of the samples (S; unique per run; in a blend offset by dataset,
    :data:`~vfm_core.data.blend.POSITION_STRIDE`)."""
    layouts: list[PackLayout] | None = None
    """Packed: the token layout of each of the P packs (its samples in order); else None."""

    def __post_init__(self) -> None:
        n = len(self.keys)
        if len(self.positions) != n or self.text.shape[0] != n or len(self.text_lengths) != n:
            raise ValueError(
                f"TrainBatch: {n} keys, {len(self.positions)} positions, "
                f"{self.text.shape[0]} captions, {len(self.text_lengths)} caption lengths"
            )
        if self.layouts is not None and sum(p.n_samples for p in self.layouts) != n:
            raise ValueError(f"TrainBatch: {n} samples but packs of {self.pack_sizes}")

    @property
    def packed(self) -> bool:
        return self.layouts is not None

    @property
    def n_samples(self) -> int:
        return len(self.keys)

    @property
    def pack_sizes(self) -> list[int]:
        """Samples of each pack (packed)."""
        return [p.n_samples for p in self.layouts or []]

    def _take(self, rows: slice, samples: slice) -> TrainBatch:
        return TrainBatch(
            values=self.values[rows],
            text=self.text[samples],
            text_lengths=self.text_lengths[samples],
            keys=self.keys[samples],
            positions=self.positions[samples],
            layouts=None if self.layouts is None else self.layouts[rows],
        )

    def rows(self, start: int, stop: int) -> TrainBatch:
        """Rows [start, stop): samples of an unpacked batch, packs (with their samples) of a
        packed one."""
        if self.layouts is None:
            return self._take(slice(start, stop), slice(start, stop))
        first = sum(self.pack_sizes[:start])
        last = first + sum(self.pack_sizes[start:stop])
        return self._take(slice(start, stop), slice(first, last))

    def sample_values(self) -> list[torch.Tensor]:
        """Each sample's values: its row (unpacked), or its tokens in its pack (n_s, C*p) /
        ids (n_s,) (packed)."""
        if self.layouts is None:
            return list(self.values)
        return [t for row, p in zip(self.values, self.layouts) for t in unpack_tokens(row, p)]

    def packs(self) -> list[TrainBatch]:
        """Each pack as a one-pack batch (packed only)."""
        if self.layouts is None:
            raise ValueError("TrainBatch.packs: the batch is not packed")
        return [self.rows(i, i + 1) for i in range(len(self.layouts))]


@runtime_checkable
class LatentSource(Protocol):
    """A savable, deterministic stream of :class:`TrainBatch`: same state, same batches.

    ``state_dict`` returns a small JSON-serialisable dict; ``load_state_dict`` restores it exactly.
    """

    def next_batch(self) -> TrainBatch: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...
