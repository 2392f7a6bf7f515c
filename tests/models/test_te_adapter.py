from __future__ import annotations

import pytest
import torch

from vfm_core.config import ConfigError
from vfm_core.models.layers import attention
from vfm_core.models.te_adapter import context_backend, resolve_attention_backend, te_status


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU fallback")
def test_auto_falls_back_to_sdpa_without_cuda_and_te_is_refused():
    usable, reason = te_status()
    assert not usable and reason == "no CUDA device"
    backend, why = resolve_attention_backend("auto")
    assert backend == "sdpa" and "no CUDA device" in why
    with pytest.raises(ConfigError, match="'te' requested but unusable: no CUDA device"):
        resolve_attention_backend("te")


def test_explicit_backends_pass_through():
    assert resolve_attention_backend("math")[0] == "math"
    assert resolve_attention_backend("sdpa")[0] == "sdpa"
    with pytest.raises(ConfigError, match="unknown backend 'flash9'"):
        resolve_attention_backend("flash9")


@pytest.mark.gpu
def test_te_attention_matches_sdpa_on_gpu():
    if not te_status()[0]:
        pytest.skip(te_status()[1])
    q = torch.randn(2, 8, 128, 64, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(2, 2, 128, 64, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(2, 2, 128, 64, device="cuda", dtype=torch.bfloat16)
    ref = attention(q, k, v)
    torch.testing.assert_close(attention(q, k, v, backend="te"), ref, rtol=2e-2, atol=2e-2)


def test_context_parallel_attention_selects_te_only_where_it_applies():
    """The ring call takes TE's context-parallel attention only with the ``te`` backend, on a
    GPU, unpacked, and causal only over the balanced placement; elsewhere PyTorch's / vfm's
    ring, saying why."""
    q = torch.zeros(1, 2, 8, 4)
    assert context_backend(q, backend="sdpa", packed=False, causal=False, balanced=True) == (
        "torch",
        "attention backend 'sdpa'",
    )
    impl, why = context_backend(q, backend="te", packed=True, causal=False, balanced=True)
    assert impl == "torch" and "packed" in why
    impl, why = context_backend(q, backend="te", packed=False, causal=True, balanced=False)
    assert impl == "torch" and "zigzag" in why
    impl, why = context_backend(q, backend="te", packed=False, causal=True, balanced=True)
    assert (impl, why) == ("torch", "tensors not on a CUDA device")


@pytest.mark.gpu
def test_te_context_parallel_attention_is_chosen_on_gpu():
    if not te_status()[0]:
        pytest.skip(te_status()[1])
    q = torch.zeros(1, 2, 8, 4, device="cuda")
    impl, _ = context_backend(q, backend="te", packed=False, causal=True, balanced=True)
    assert impl == "te"
