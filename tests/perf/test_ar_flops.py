"""FLOPs of the causal video transformer: FlopCounterMode on a real forward + backward, with the
masked (full-square) attention halved to the triangle the model counts, agrees within 2%."""

from __future__ import annotations

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from vfm_core.config import ModelConfig
from vfm_core.models.ar import CausalVideoTransformer, next_token_loss
from vfm_core.models.local_attention import set_attention_backend
from vfm_core.perf.flops import train_flops, train_flops_per_token


@pytest.mark.parametrize("kv_heads,text", [(None, "cross"), (2, "cross"), (None, "pooled")])
def test_ar_train_flops_match_flop_counter(kv_heads, text):
    cfg = ModelConfig(
        arch="ar",
        vocab_size=300,
        hidden=128,
        depth=2,
        heads=4,
        kv_heads=kv_heads,
        text_dim=32,
        text_len=5,
        text_conditioning=text,
    )
    torch.manual_seed(0)
    model = set_attention_backend(CausalVideoTransformer(cfg), "math")
    tokens = torch.randint(0, cfg.vocab_size, (2, 3, 4, 4))  # 48 tokens per sample
    text = torch.randn(2, cfg.text_len, cfg.text_dim)
    n = 48
    counter = FlopCounterMode(display=False)
    with counter:
        next_token_loss(model(tokens, text), tokens.flatten(1)).backward()
    counted = counter.get_total_flops()
    inner = cfg.heads * cfg.head_dim
    # the math kernel computes the full square for self-attention (fwd 4·S²·Dq, training 3×);
    # the model counts the causal triangle S(S+1)/2 of it
    full_self = 2 * cfg.depth * 3 * 4.0 * n * n * inner
    expected = counted - full_self + full_self * (n + 1) / (2 * n)
    ours = train_flops(cfg, seq_lens=n, batch=2)
    assert ours["total"] == pytest.approx(expected, rel=0.02)
    assert ours["head"] == pytest.approx(2 * 3 * 2 * n * cfg.hidden * cfg.vocab_size)
    assert train_flops_per_token(cfg, seq_len=n) == pytest.approx(ours["total"] / (2 * n))
