"""A DiT-family model in float64 with every weight drawn at random: the zero-initialised AdaLN
and output layers would hide mistakes in equivalence tests."""

from __future__ import annotations

import torch

from vfm_core.config import ModelConfig
from vfm_core.families import build_model


def random_model(cfg: ModelConfig, *, seed: int) -> torch.nn.Module:
    """``build_model(cfg)`` in float64 with N(0, 0.15^2) weights from ``seed``."""
    torch.manual_seed(0)
    model = build_model(cfg).double()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g, dtype=p.dtype) * 0.15)
    return model
