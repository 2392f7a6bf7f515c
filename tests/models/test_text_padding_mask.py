"""Token-level text conditioning in the unpacked forward: a caption of l tokens zero-padded to any
``text_len`` gives the same output as the caption alone (the zero rows are masked in
cross-attention), for the DiT family and the causal video transformer; an all-zero condition
(the null caption of runs without a text record) behaves as before (every key kept). Pooled
text conditioning averages the same real tokens."""

from __future__ import annotations

import pytest
import torch
from model_init import random_model

from vfm_core.config import ModelConfig
from vfm_core.models.layers import padding_mask

ARCHS = {
    "dit": dict(arch="dit"),
    "stdit": dict(arch="stdit", stdit_full_every=2),
    "llama_dit": dict(arch="llama_dit", norm="rms", mlp="swiglu", kv_heads=2),
    "ar": dict(arch="ar", vocab_size=64, norm="rms", mlp="swiglu", kv_heads=2, patch=(1, 1, 1)),
    # pooled text conditioning: the mean of the real tokens, no cross-attention
    "dit_pooled": dict(arch="dit", text_conditioning="pooled"),
    "ar_pooled": dict(arch="ar", vocab_size=64, patch=(1, 1, 1), text_conditioning="pooled"),
}


def _model(arch: str) -> torch.nn.Module:
    cfg = ModelConfig(
        in_channels=4,
        hidden=64,
        depth=2,
        heads=4,
        text_dim=32,
        text_len=8,
        adaln_lora_rank=8,
        **ARCHS[arch],
    )
    return random_model(cfg, seed=7)


def _run(model, arch: str, text: torch.Tensor) -> torch.Tensor:
    g = torch.Generator().manual_seed(3)
    if arch.startswith("ar"):
        ids = torch.randint(0, 64, (text.shape[0], 2, 2, 3), generator=g)  # (B, T, H, W)
        return model(ids, text)
    x = torch.randn(text.shape[0], 4, 2, 4, 4, generator=g, dtype=torch.float64)
    return model(x, torch.full((text.shape[0],), 0.3, dtype=torch.float64), text)


@pytest.mark.parametrize("arch", list(ARCHS))
def test_padded_caption_equals_the_caption_alone(arch):
    model = _model(arch)
    g = torch.Generator().manual_seed(1)
    caption = torch.randn(2, 3, 32, generator=g, dtype=torch.float64)  # 3 real tokens
    alone = _run(model, arch, caption)
    for pad in (1, 5):
        padded = torch.cat([caption, caption.new_zeros(2, pad, 32)], 1)  # (2, 3 + pad, 32)
        diff = (_run(model, arch, padded) - alone).abs().max().item()
        assert diff < 1e-10, f"{arch}: pad {pad} changed the output by {diff:.2e}"
    # unmasked, padding would change the output: the mask is what makes them equal
    unmasked = torch.cat([caption, caption.new_full((2, 5, 32), 1e-30)], 1)
    assert (_run(model, arch, unmasked) - alone).abs().max().item() > 1e-6


def test_rows_of_different_lengths_and_the_all_zero_null():
    text = torch.zeros(3, 4, 2)
    text[0, :2] = 1.0  # 2 tokens
    text[1, :4] = 1.0  # full: nothing masked
    mask = padding_mask(text)  # row 2: all zero -> every key kept
    assert mask.tolist() == [[True, True, False, False], [True] * 4, [True] * 4]
    assert padding_mask(torch.ones(2, 3, 2)) is None  # no padding: plain attention
