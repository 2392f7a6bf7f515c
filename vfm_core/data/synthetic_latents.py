"""Synthetic latent source: moving Gaussian blobs in latent space, each motion class with a caption
embedding — a learnable, text-conditioned stand-in for tokenizer latents before real shards exist.

Sample ``i`` is a pure function of ``(seed, i)``, so the stream is savable as one integer and
exactly reproducible after a restore in a new process.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from vfm_core.config import DataConfig, ModelConfig
from vfm_core.data.samples import TrainBatch

STATE_VERSION = 1


class SyntheticLatents:
    """Class k moves a blob with velocity v_k and a per-class channel pattern; its caption embedding
    is a fixed random unit vector per class (shared with the conditional generation demo)."""

    def __init__(self, data: DataConfig, model: ModelConfig, *, sigma_data: float = 0.5):
        self.data, self.model = data, model
        self.sigma_data = sigma_data
        self.position = 0  # index of the next sample
        g = torch.Generator().manual_seed(data.seed * 7919 + 17)
        k = data.num_captions
        self.captions = [f"blob class {i}" for i in range(k)]
        emb = torch.randn(k, model.text_len, model.text_dim, generator=g)
        self.text_emb = emb / emb.norm(dim=-1, keepdim=True)  # (K, L, Dt)
        self.channel_pattern = torch.randn(k, model.in_channels, generator=g)  # (K, C)
        angles = torch.arange(k) * (2 * math.pi / k)
        self.velocity = torch.stack([angles.sin(), angles.cos()], dim=-1) * 1.5  # (K, 2) px/frame

    def sample(self, index: int) -> tuple[torch.Tensor, torch.Tensor, str]:
        """Latent (C, T, H, W), text (L, Dt) and key of sample ``index``."""
        d = self.data
        g = torch.Generator().manual_seed(d.seed * 1_000_003 + index)
        k = int(torch.randint(d.num_captions, (1,), generator=g))
        start = torch.rand(2, generator=g) * torch.tensor([d.latent_height, d.latent_width])
        t = torch.arange(d.latent_frames, dtype=torch.float32)
        centre = start[None] + t[:, None] * self.velocity[k][None]  # (T, 2)
        ys = torch.arange(d.latent_height, dtype=torch.float32)
        xs = torch.arange(d.latent_width, dtype=torch.float32)
        radius = max(d.latent_height, d.latent_width) / 6
        dy = ys[None, :, None] - centre[:, 0, None, None]  # (T, H, 1)
        dx = xs[None, None, :] - centre[:, 1, None, None]  # (T, 1, W)
        blob = torch.exp(-(dy**2 + dx**2) / (2 * radius**2))  # (T, H, W)
        noise = 0.05 * torch.randn(self.model.in_channels, *blob.shape, generator=g)
        latent = self.channel_pattern[k][:, None, None, None] * blob[None] + noise  # (C, T, H, W)
        latent = latent * self.sigma_data  # unit-scale pattern -> ~sigma_data std (EDM scaling)
        return latent, self.text_emb[k], f"synthetic-{d.seed}-{index:09d}-c{k}"

    def next_batch(self) -> TrainBatch:
        first, b = self.position, self.data.batch_size
        items = [self.sample(first + i) for i in range(b)]
        self.position += b
        return TrainBatch(
            values=torch.stack([x for x, _, _ in items]),  # (B, C, T, H, W)
            text=torch.stack([e for _, e, _ in items]),  # (B, L, Dt)
            text_lengths=torch.full((b,), self.model.text_len),  # (B,) every token valid
            keys=[key for _, _, key in items],
            positions=list(range(first, first + b)),
        )

    def state_dict(self) -> dict[str, Any]:
        return {
            "version": STATE_VERSION,
            "kind": "synthetic",
            "seed": self.data.seed,
            "position": self.position,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("version") != STATE_VERSION or state.get("kind") != "synthetic":
            raise ValueError(
                f"data state {state!r} is not a synthetic source state v{STATE_VERSION}"
            )
        if state["seed"] != self.data.seed:
            raise ValueError(
                f"data state was saved with data.seed={state['seed']}, config has {self.data.seed}"
            )
        self.position = int(state["position"])
