"""One training step of a tiny DiT under a parallel layout vs. one process on the same global batch.

Shared by the equivalence tests: :func:`step_worker` runs on every gloo rank, builds the
single-process reference *and* the parallelized copy from the same seed, takes one EDM step on the
global batch (reference) and on this rank's data-parallel slice (parallel), and returns the relative
errors of the loss and of every gathered gradient.
"""

from __future__ import annotations

import copy

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from vfm_core.config import DiffusionConfig, ModelConfig
from vfm_core.diffusion.edm import create_diffusion
from vfm_core.models.dit import build_model
from vfm_core.parallel.dims import ParallelDims
from vfm_core.parallel.parallelize import parallelize_dit, sync_grads

GLOBAL_BATCH = 4
LATENT = (4, 4, 8, 8)  # (C, T, H, W) -> grid (4, 4, 4) = 64 tokens with patch (1, 2, 2)

ARCHS = {
    "dit": dict(arch="dit"),
    "stdit": dict(arch="stdit"),
    "llama_dit": dict(arch="llama_dit", norm="rms", mlp="swiglu", kv_heads=2),
    "dit_zero": dict(arch="dit", adaln="zero"),
}


def tiny_model_cfg(arch: str) -> ModelConfig:
    return ModelConfig(
        in_channels=4, hidden=64, depth=2, heads=4, text_dim=32, text_len=4, adaln_lora_rank=8,
        **ARCHS[arch],
    )


def _randomize(model: torch.nn.Module) -> None:
    """Non-zero AdaLN / output weights (the zero init would make most gradients exactly 0)."""
    g = torch.Generator().manual_seed(123)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g, dtype=p.dtype) * 0.15)


def _batch():
    g = torch.Generator().manual_seed(5)
    x0 = torch.randn(GLOBAL_BATCH, *LATENT, generator=g, dtype=torch.float64) * 0.5
    text = torch.randn(GLOBAL_BATCH, 4, 32, generator=g, dtype=torch.float64)
    sigma = torch.exp(torch.randn(GLOBAL_BATCH, generator=g, dtype=torch.float64) * 1.2 - 1.2)
    noise = torch.randn(GLOBAL_BATCH, *LATENT, generator=g, dtype=torch.float64)
    return x0, text, sigma, noise


def _full_grad(p: torch.nn.Parameter) -> torch.Tensor:
    g = p.grad
    return g.full_tensor() if isinstance(g, DTensor) else g


def step_worker(rank: int, world: int, arch: str, degrees: dict, options: dict) -> dict:
    """Returns {"loss_err", "grad_err" (max over parameters of max|diff| / max|ref|), "checked",
    "worst"} for this rank."""
    cfg = tiny_model_cfg(arch)
    edm = create_diffusion(DiffusionConfig())
    torch.manual_seed(0)
    ref = build_model(cfg).double()
    _randomize(ref)
    model = copy.deepcopy(ref)
    x0, text, sigma, noise = _batch()

    ref_loss = edm.loss(ref, x0, text, sigma=sigma, noise=noise).mean()
    ref_loss.backward()

    dims = ParallelDims(**degrees, world_size=world)
    model = parallelize_dit(model, parallel_dims=dims, **options)
    b = GLOBAL_BATCH // dims.dp
    sl = slice(dims.dp_rank() * b, (dims.dp_rank() + 1) * b)
    loss = edm.loss(model, x0[sl], text[sl], sigma=sigma[sl], noise=noise[sl]).mean()
    loss.backward()
    sync_grads(model)
    # every rank of one data-parallel slice holds the same loss: the mean over ranks is global
    total = loss.detach().clone()
    dist.all_reduce(total)
    loss_err = abs(total.item() / world - ref_loss.item()) / abs(ref_loss.item())

    ref_params = dict(ref.named_parameters())
    worst, worst_name, checked = 0.0, "", 0
    for name, p in model.named_parameters():
        r = ref_params[name].grad
        g = _full_grad(p)
        err = ((g - r).abs().max() / r.abs().max().clamp_min(1e-30)).item()
        checked += 1
        if err > worst:
            worst, worst_name = err, name
    assert checked == len(ref_params), (checked, len(ref_params))
    return {"loss_err": loss_err, "grad_err": worst, "worst": worst_name, "checked": checked}


def steps_worker(rank: int, world: int, cases: list) -> list[dict]:
    """:func:`step_worker` for several (arch, degrees, options) cases in one spawn (the process
    start-up dominates a tiny step on CPU); a failing case reports its error, not a crash."""
    out = []
    for arch, degrees, options in cases:
        try:
            out.append(step_worker(rank, world, arch, degrees, options))
        except Exception as e:  # reported per case by the test
            out.append({"error": f"{type(e).__name__}: {e}"})
    return {"cases": out, "mesh": mesh_coords(world)}


def mesh_coords(world: int) -> dict:
    """This rank's coordinates in a tp=2 mesh (checked by test_dims via the same spawn)."""
    dims = ParallelDims(tp=2, world_size=world)
    dims.build_mesh("cpu")
    return {
        "names": list(dims.mesh.mesh_dim_names),
        "tp": dims.coord("tp"),
        "dp": dims.dp_rank(),
        "cp": dims.coord("cp"),
        "tp_ranks": dims.submesh("tp").mesh.flatten().tolist(),
        "dp_ranks": dims.dp_mesh().mesh.flatten().tolist(),
    }


def pipeline_worker(rank: int, world: int, cases: list) -> list[dict]:
    """Pipeline-parallel step (``world`` stages) vs 1 process: loss on the last stage and the
    gradients of every parameter each stage holds."""
    from vfm_core.parallel.pipeline import DiTPipeline, sync_pipeline_grads

    out = []
    for arch, schedule, microbatches in cases:
        cfg = tiny_model_cfg(arch)
        edm = create_diffusion(DiffusionConfig())
        torch.manual_seed(0)
        ref = build_model(cfg).double()
        _randomize(ref)
        model = copy.deepcopy(ref)
        x0, text, sigma, noise = _batch()
        ref_loss = edm.loss(ref, x0, text, sigma=sigma, noise=noise).mean()
        ref_loss.backward()
        grid = (LATENT[1], LATENT[2] // 2, LATENT[3] // 2)
        pipe = DiTPipeline(
            model,
            parallel_dims=ParallelDims(pp=world, world_size=world),
            grid=grid,
            microbatches=microbatches,
            schedule=schedule,
        )
        loss = pipe.step(edm, x0, text, sigma=sigma, noise=noise)
        sync_pipeline_grads(pipe)
        ref_params = dict(ref.named_parameters())
        worst, worst_name, names = 0.0, "", []
        for name, p in pipe.module.named_parameters():
            r = ref_params[name].grad
            err = ((p.grad - r).abs().max() / r.abs().max().clamp_min(1e-30)).item()
            names.append(name)
            if err > worst:
                worst, worst_name = err, name
        out.append(
            {
                "loss_err": None if loss is None else abs(loss.item() / ref_loss.item() - 1),
                "grad_err": worst,
                "worst": worst_name,
                "names": names,
            }
        )
    return out
