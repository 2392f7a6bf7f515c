"""Token sampling: the KV cache changes nothing (greedy and seeded sampling), prompts are kept,
the nucleus filter keeps what it should, bad parameters are named."""

from __future__ import annotations

import pytest
import torch

from vfm_core.config import ModelConfig
from vfm_core.infer.ar_sample import SamplingConfig, SamplingError, filter_logits, sample_tokens
from vfm_core.models.ar import CausalVideoTransformer

CFG = ModelConfig(
    arch="ar", vocab_size=40, hidden=32, depth=2, heads=4, kv_heads=2, text_dim=8, text_len=2
)
GRID = (2, 2, 3)


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return CausalVideoTransformer(CFG).double().eval()


def _text(b=2):
    return torch.randn(
        b,
        CFG.text_len,
        CFG.text_dim,
        generator=torch.Generator().manual_seed(3),
        dtype=torch.float64,
    )


KINDS = [
    dict(temperature=0.0),
    dict(temperature=1.0, top_k=10, seed=4),
    dict(temperature=0.8, top_p=0.9, guidance=3.0, seed=2),
]


@pytest.mark.parametrize("kw", KINDS)
def test_cache_equals_no_cache(model, kw):
    a = sample_tokens(model, _text(), GRID, SamplingConfig(**kw))
    b = sample_tokens(model, _text(), GRID, SamplingConfig(**kw, use_cache=False))
    assert a.shape == (2, *GRID) and a.dtype == torch.long
    assert torch.equal(a, b)
    assert int(a.min()) >= 0 and int(a.max()) < CFG.vocab_size


def test_greedy_is_the_argmax_of_the_model(model):
    text = _text(1)
    tokens = sample_tokens(model, text, GRID, SamplingConfig(temperature=0.0))
    logits = model(tokens, text)  # (1, N, V): teacher-forced on its own samples
    assert torch.equal(logits.argmax(-1), tokens.flatten(1))


def test_prompt_is_kept_and_seeds_differ(model):
    prompt = torch.tensor([[5, 6, 7], [1, 2, 3]])
    out = sample_tokens(model, _text(), GRID, SamplingConfig(seed=1), prompt=prompt)
    assert torch.equal(out.flatten(1)[:, :3], prompt)
    other = sample_tokens(model, _text(), GRID, SamplingConfig(seed=2), prompt=prompt)
    assert not torch.equal(out, other)


def test_filter_logits():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    kept = filter_logits(logits, top_k=0, top_p=0.8).isfinite()
    assert kept.tolist() == [[True, True, False, False]]
    assert filter_logits(logits, top_k=1, top_p=1.0).isfinite().sum() == 1


@pytest.mark.parametrize(
    "kw,msg",
    [
        (dict(top_p=0.0), "top_p"),
        (dict(top_p=1.5), "top_p"),
        (dict(temperature=-1.0), "temperature"),
        (dict(top_k=-2), "top_k"),
    ],
)
def test_bad_parameters_are_named(model, kw, msg):
    with pytest.raises(SamplingError, match=msg):
        sample_tokens(model, _text(), GRID, SamplingConfig(**kw))


def test_prompt_longer_than_the_video_is_named(model):
    with pytest.raises(SamplingError, match="longer than the video's 12 tokens"):
        sample_tokens(model, _text(), GRID, SamplingConfig(), prompt=torch.zeros(2, 13).long())


def test_guidance_uses_the_given_null_caption(model):
    """CFG's unconditional branch is the run's null caption (what caption dropout trains)."""
    text = _text()
    cfg = SamplingConfig(temperature=0.0, guidance=3.0)
    zeros = sample_tokens(model, text, GRID, cfg, null_text=torch.zeros_like(text[:1]))
    assert torch.equal(zeros, sample_tokens(model, text, GRID, cfg))  # default: zeros
    null = torch.randn(1, *text.shape[1:], generator=torch.Generator().manual_seed(9))
    assert not torch.equal(zeros, sample_tokens(model, text, GRID, cfg, null_text=null))
