"""Exponential moving average of the trained weights, kept shard by shard.

The average is a clone of every parameter this rank holds (plain tensors, or DTensor shards on
the same meshes as the parameters), never a copy of a whole model: under FSDP a rank holds
1/dp_shard of the EMA, under pipeline parallelism its stages' share. Its state dict uses the
one-process model's parameter names, so checkpoints load under any layout (and generation reads
``ema.<name>`` like ``model.<name>``).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import torch
from torch import nn

from vfm_core.parallel.world import local_tensor


class EMA:
    """``ema <- ema + (1 - decay) (param - ema)`` after every optimizer step, per local shard."""

    def __init__(self, parts: Iterable[nn.Module], decay: float):
        self.decay = decay
        self.parts = list(parts)
        self.shadow = [  # of what trains: a frozen parameter is its own average
            {n: p.detach().clone() for n, p in part.named_parameters() if p.requires_grad}
            for part in self.parts
        ]

    def _pairs(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        for shadow, part in zip(self.shadow, self.parts, strict=True):
            for name, p in part.named_parameters():
                if name in shadow:
                    yield shadow[name], p

    @torch.no_grad()
    def update(self) -> None:
        for avg, p in self._pairs():
            local_tensor(avg).lerp_(local_tensor(p.detach()), 1.0 - self.decay)

    def state_dict(self) -> dict[str, torch.Tensor]:
        """{parameter name: averaged tensor} (replicas of several local stages: one entry)."""
        out: dict[str, torch.Tensor] = {}
        for shadow in self.shadow:
            out.update(shadow)
        return out

    @torch.no_grad()
    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        for shadow in self.shadow:
            missing = sorted(set(shadow) - set(state))
            if missing:
                raise KeyError(f"EMA state lacks {missing[0]} (and {len(missing) - 1} more)")
            for name, avg in shadow.items():
                if state[name] is not avg:
                    local_tensor(avg).copy_(local_tensor(state[name]))
