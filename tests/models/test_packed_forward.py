"""Packed sequences through the DiT: a pack of samples of different grids, each with its own
noise level and caption length, equals the batched forward of every sample alone (fp64,
tolerance 1e-10), for DiT, ST-DiT (spatial + temporal + full blocks) and Llama-DiT (GQA); the
packed EDM loss equals the per-sample batched losses, gradients included; padding is inert."""

from __future__ import annotations

import pytest
import torch
from model_init import random_model

from vfm_core.config import DiffusionConfig, ModelConfig
from vfm_core.diffusion.objective import create_diffusion
from vfm_core.diffusion.packed import packed_loss
from vfm_core.geometry import PackLayout, ShapeError, attention_groups, pack_latents, unpack_latents

TOL = 1e-10
ARCHS = {
    "dit": dict(arch="dit"),
    "stdit": dict(arch="stdit", stdit_full_every=2),  # block 0 spatial+temporal, block 1 full
    "llama_dit": dict(arch="llama_dit", norm="rms", mlp="swiglu", kv_heads=2),
    "dit_zero": dict(arch="dit", adaln="zero"),
    "dit_abs_pos": dict(arch="dit", abs_pos=12),  # absolute position features too
    "dit_abs_only": dict(arch="dit", abs_pos=12, rope=False),  # and no RoPE
    "dit_pooled": dict(arch="dit", text_conditioning="pooled"),  # caption mean, no cross-attn
}
# latent (C, T, H, W) per sample -> grids (2,2,3), (1,3,2), (3,1,2) with patch (1, 2, 2)
SHAPES = [(4, 2, 4, 6), (4, 1, 6, 4), (4, 3, 2, 4)]
TEXT_LENGTHS = [4, 2, 3]


def _model(arch: str) -> torch.nn.Module:
    cfg = ModelConfig(
        in_channels=4,
        hidden=64,
        depth=2,
        heads=4,
        text_dim=32,
        text_len=4,
        adaln_lora_rank=8,
        **ARCHS[arch],
    )
    return random_model(cfg, seed=123)


def _samples(seed: int = 5):
    g = torch.Generator().manual_seed(seed)
    x0 = [torch.randn(s, generator=g, dtype=torch.float64) * 0.5 for s in SHAPES]
    noise = [torch.randn(s, generator=g, dtype=torch.float64) for s in SHAPES]
    text = torch.randn(len(SHAPES), 4, 32, generator=g, dtype=torch.float64)
    sigma = torch.exp(torch.randn(len(SHAPES), generator=g, dtype=torch.float64) - 1.0)
    return x0, noise, text, torch.tensor(TEXT_LENGTHS), sigma


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).abs().max() / b.abs().max()).item()


@pytest.mark.parametrize("arch", list(ARCHS))
@pytest.mark.parametrize("length", [None, 40])  # exact (24 tokens), and padded by 16 tokens
def test_packed_forward_equals_each_sample_alone(arch, length):
    model = _model(arch)
    x0, _, text, lengths, sigma = _samples()
    c_noise = sigma.log() / 4
    tokens, layout = pack_latents(x0, model.cfg.patch, length)
    out = model.forward_packed(tokens, c_noise, text, lengths, layout)  # (N, C*P)
    assert out.shape == tokens.shape and torch.isfinite(out).all()
    got = unpack_latents(out, layout, model.cfg.patch, model.cfg.in_channels)
    for s, z in enumerate(x0):
        ref = model(z[None], c_noise[s : s + 1], text[s : s + 1, : TEXT_LENGTHS[s]])[0]
        assert got[s].shape == z.shape
        assert _rel(got[s], ref) < TOL, f"{arch} sample {s}: {_rel(got[s], ref):.2e}"


@pytest.mark.parametrize("arch", ["dit", "stdit", "llama_dit"])
def test_packed_loss_and_gradients_equal_per_sample_losses(arch):
    ref_model, model = _model(arch), _model(arch)
    edm = create_diffusion(DiffusionConfig())
    x0, noise, text, lengths, sigma = _samples()
    ref = torch.stack(
        [
            edm.loss(
                ref_model,
                z[None],
                text[s : s + 1, : TEXT_LENGTHS[s]],
                sigma=sigma[s : s + 1],
                noise=noise[s][None],
            )[0]
            for s, z in enumerate(x0)
        ]
    )  # (S,)
    ref.mean().backward()

    patch = model.cfg.patch
    tokens, layout = pack_latents(x0, patch, 40)
    noise_tok, _ = pack_latents(noise, patch, 40)

    def net(x, c, t):
        return model.forward_packed(x, c, t, lengths, layout)

    loss = packed_loss(
        edm, net, tokens, text, sigma=sigma, noise=noise_tok, sample_ids=layout.sample_ids
    )  # (S,)
    assert _rel(loss, ref) < TOL
    loss.mean().backward()
    ref_params = dict(ref_model.named_parameters())
    for name, p in model.named_parameters():
        r = ref_params[name].grad
        assert p.grad is not None and torch.isfinite(p.grad).all(), name
        assert _rel(p.grad, r) < TOL, f"{arch} {name}: {_rel(p.grad, r):.2e}"


def test_padding_tokens_do_not_change_loss_or_gradients():
    model = _model("stdit")
    edm = create_diffusion(DiffusionConfig())
    x0, noise, text, lengths, sigma = _samples()
    tokens, layout = pack_latents(x0, model.cfg.patch, 40)
    noise_tok, _ = pack_latents(noise, model.cfg.patch, 40)
    pad = layout.sample_ids < 0
    assert int(pad.sum()) == 16
    grads = []
    for fill in (0.0, 1e3):  # garbage in the padding rows must not matter
        model.zero_grad()
        t, n = tokens.clone(), noise_tok.clone()
        t[pad], n[pad] = fill, -fill
        loss = packed_loss(
            edm,
            lambda x, c, tx: model.forward_packed(x, c, tx, lengths, layout),
            t,
            text,
            sigma=sigma,
            noise=n,
            sample_ids=layout.sample_ids,
        ).mean()
        loss.backward()
        grads.append((loss.detach(), [p.grad.clone() for p in model.parameters()]))
    (l0, g0), (l1, g1) = grads
    assert torch.isfinite(l0) and _rel(l1, l0) < TOL
    assert all(torch.isfinite(a).all() and _rel(b, a) < TOL for a, b in zip(g0, g1) if a.any())


def test_attention_groups_per_layout():
    layout = PackLayout.from_grids([(2, 1, 2), (1, 2, 1)], length=8)
    ids = {k: attention_groups(layout, k).tolist() for k in ("full", "spatial", "temporal")}
    assert ids["full"] == [0, 0, 0, 0, 1, 1, -7, -8]
    assert ids["spatial"] == [0, 0, 1, 1, 2, 2, -7, -8]  # (sample, t)
    assert ids["temporal"] == [0, 1, 0, 1, 2, 3, -7, -8]  # (sample, h, w)
    with pytest.raises(ValueError, match="unknown"):
        attention_groups(layout, "diagonal")


def test_bad_pack_inputs_name_the_problem():
    model = _model("dit")
    edm = create_diffusion(DiffusionConfig())
    x0, noise, text, lengths, sigma = _samples()
    tokens, layout = pack_latents(x0, model.cfg.patch)
    c = sigma.log() / 4
    with pytest.raises(ShapeError, match="packed tokens"):
        model.forward_packed(tokens[:-1], c, text, lengths, layout)
    with pytest.raises(ShapeError, match="c_noise"):
        model.forward_packed(tokens, c[:2], text, lengths, layout)
    with pytest.raises(ShapeError, match="text_lengths"):
        model.forward_packed(tokens, c, text, torch.tensor([4, 0, 3]), layout)
    with pytest.raises(ShapeError, match="latents\\[1\\]"):
        pack_latents([x0[0], x0[1][0]], model.cfg.patch)
    with pytest.raises(ValueError, match="samples \\[3\\] have no token"):
        packed_loss(
            edm,
            lambda x, c, t: x,
            tokens,
            None,
            sigma=torch.ones(4),
            noise=tokens,
            sample_ids=layout.sample_ids,
        )
    with pytest.raises(ValueError, match="only 2 samples"):
        packed_loss(
            edm,
            lambda x, c, t: x,
            tokens,
            None,
            sigma=torch.ones(2),
            noise=tokens,
            sample_ids=layout.sample_ids,
        )
