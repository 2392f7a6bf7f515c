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
from vfm_core.diffusion.objective import create_diffusion
from vfm_core.families import build_model
from vfm_core.parallel.dims import ParallelDims
from vfm_core.parallel.parallelize import parallelize_dit, sync_grads

GLOBAL_BATCH = 4
LATENT = (4, 4, 8, 8)  # (C, T, H, W) -> grid (4, 4, 4) = 64 tokens with patch (1, 2, 2)

ARCHS = {
    "dit": dict(arch="dit"),
    "stdit": dict(arch="stdit"),
    "llama_dit": dict(arch="llama_dit", norm="rms", mlp="swiglu", kv_heads=2),
    "dit_zero": dict(arch="dit", adaln="zero"),
    "dit_pooled": dict(arch="dit", text_conditioning="pooled"),  # no cross-attention
    "llama_fused": dict(  # one qkv GEMM (model.fused_proj)
        arch="llama_dit", norm="rms", mlp="swiglu", kv_heads=2, fused_proj=True
    ),
}


def tiny_model_cfg(arch: str, **over) -> ModelConfig:
    base = dict(
        in_channels=4, hidden=64, depth=2, heads=4, text_dim=32, text_len=4, adaln_lora_rank=8
    )
    return ModelConfig(**{**base, **ARCHS[arch], **over})


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


def seeded_pair(cfg: ModelConfig) -> tuple[torch.nn.Module, torch.nn.Module]:
    """The fp64 single-process reference (seed 0, randomized weights) and a copy to split."""
    torch.manual_seed(0)
    ref = build_model(cfg).double()
    _randomize(ref)
    return ref, copy.deepcopy(ref)


def grad_report(named_params, ref: torch.nn.Module) -> dict:
    """Every gradient of ``named_params`` (gathered if sharded) vs. the same parameter's of
    ``ref``: {"grad_err" (max over parameters of max|diff| / max|ref|), "worst", "names",
    "nonfinite"}."""
    ref_params = dict(ref.named_parameters())
    worst, worst_name, names, nonfinite = 0.0, "", [], []
    for name, p in named_params:
        r, g = ref_params[name].grad, _full_grad(p)
        if not torch.isfinite(g).all():
            nonfinite.append(name)
        err = ((g - r).abs().max() / r.abs().max().clamp_min(1e-30)).item()
        names.append(name)
        if err > worst:
            worst, worst_name = err, name
    return {"grad_err": worst, "worst": worst_name, "names": names, "nonfinite": nonfinite}


def reference_step(arch: str, **over) -> tuple:
    """The EDM, the fp64 reference after its backward on the global batch, the copy to split,
    the batch ``(x0, text, sigma, noise)`` and the reference loss."""
    edm = create_diffusion(DiffusionConfig())
    ref, model = seeded_pair(tiny_model_cfg(arch, **over))
    batch = _batch()
    x0, text, sigma, noise = batch
    ref_loss = edm.loss(ref, x0, text, sigma=sigma, noise=noise).mean()
    ref_loss.backward()
    return edm, ref, model, batch, ref_loss


def data_parallel_report(loss, ref_loss, model, ref, world: int) -> dict:
    """After a data-parallel step: the relative error of the global loss (every rank of one dp
    slice holds its slice's loss, so the mean over all ranks is the global loss) and the
    :func:`grad_report` of every parameter ("checked" of them, all of ``ref``'s)."""
    total = loss.detach().clone()
    dist.all_reduce(total)
    loss_err = abs(total.item() / world - ref_loss.item()) / abs(ref_loss.item())
    report = grad_report(model.named_parameters(), ref)
    checked = len(report["names"])
    n_ref = len(list(ref.parameters()))
    assert checked == n_ref, (checked, n_ref)
    return {"loss_err": loss_err, "checked": checked, **report}


def run_cases(case_fn, cases: list) -> list[dict]:
    """``case_fn(*case)`` for every case; a failing case reports its error instead of ending the
    spawn (the process start-up dominates a tiny step on CPU, so one spawn runs them all)."""
    out = []
    for case in cases:
        try:
            out.append(case_fn(*case))
        except Exception as e:  # reported per case by the test
            out.append({"error": f"{type(e).__name__}: {e}"})
    return out


def step_worker(rank: int, world: int, arch: str, degrees: dict, options: dict) -> dict:
    """Returns {"loss_err", "grad_err" (max over parameters of max|diff| / max|ref|), "checked",
    "worst"} for this rank."""
    edm, ref, model, (x0, text, sigma, noise), ref_loss = reference_step(arch)
    dims = ParallelDims(**degrees, world_size=world)
    model = parallelize_dit(model, parallel_dims=dims, **options)
    b = GLOBAL_BATCH // dims.dp
    sl = slice(dims.dp_rank() * b, (dims.dp_rank() + 1) * b)
    loss = edm.loss(model, x0[sl], text[sl], sigma=sigma[sl], noise=noise[sl]).mean()
    loss.backward()
    sync_grads(model)
    r = data_parallel_report(loss, ref_loss, model, ref, world)
    return {k: r[k] for k in ("loss_err", "grad_err", "worst", "checked")}


def steps_worker(rank: int, world: int, cases: list) -> list[dict]:
    """:func:`step_worker` for several (arch, degrees, options) cases in one spawn (the process
    start-up dominates a tiny step on CPU); a failing case reports its error, not a crash."""
    cases_out = run_cases(lambda *case: step_worker(rank, world, *case), cases)
    return {"cases": cases_out, "mesh": mesh_coords(world)}


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


def pipeline_step(
    world: int,
    arch: str,
    degrees: dict,
    *,
    schedule: str = "1f1b",
    micro: int = 2,
    virtual: int = 1,
    depth: int | None = None,
    options: dict | None = None,
) -> dict:
    """One EDM step of this rank's pipeline stages (``degrees`` with pp > 1, ``virtual`` stages
    per rank, each parallelised with ``options``) on its data-parallel slice vs the fp64
    one-process reference: {"loss_err", "grad_err", "worst", "names" of the parameters held,
    "has_loss", "pp", "sharded"}."""
    from vfm_core.families.diffusion import diffusion_loss
    from vfm_core.families.objective import Microbatch
    from vfm_core.parallel.pipeline import Pipeline, rank_stages, split_stage

    cfg_over = {} if depth is None else {"depth": depth}
    edm, ref, model, (x0, text, sigma, noise), ref_loss = reference_step(arch, **cfg_over)
    dims = ParallelDims(**degrees, world_size=world)
    dims.build_mesh("cpu")
    stages = dims.pp * virtual
    parts = [split_stage(model, stage=s, stages=stages) for s in rank_stages(dims, virtual)]
    for part in parts:
        parallelize_dit(part, parallel_dims=dims, **(options or {}))
    pipe = Pipeline(
        parts,
        dims=dims,
        schedule=schedule,
        microbatches=micro,
        loss_fn=diffusion_loss,
        device=torch.device("cpu"),
    )
    b = GLOBAL_BATCH // dims.dp
    sl = slice(dims.dp_rank() * b, (dims.dp_rank() + 1) * b)
    x_in, target = edm.training_pair(x0[sl], sigma[sl], noise[sl])
    c_noise = edm.precondition(sigma[sl])[3]
    grid = (LATENT[1], LATENT[2] // 2, LATENT[3] // 2)
    size = b // micro
    mbs = [
        Microbatch(
            inputs=x_in[i * size : (i + 1) * size],
            target=target[i * size : (i + 1) * size],
            kwargs={
                "c_noise": c_noise[i * size : (i + 1) * size],
                "text": text[sl][i * size : (i + 1) * size],
                "grid": grid,
            },
            weight=torch.full((size,), dims.dp / GLOBAL_BATCH, dtype=torch.float64),
        )
        for i in range(micro)
    ]
    loss = pipe.run(mbs)
    for part in parts:
        sync_grads(part)
    pipe.sync_replicas()
    total = (loss if loss is not None else torch.zeros((), dtype=torch.float64)).clone()
    dist.all_reduce(total)  # each (dp, cp, tp) rank of the last stage: dp x its slice's share
    loss_err = abs(total.item() / (world // dims.pp) / ref_loss.item() - 1)
    named = [item for part in parts for item in part.named_parameters()]
    report = grad_report(named, ref)
    return {
        "loss_err": loss_err,
        "has_loss": loss is not None,
        "grad_err": report["grad_err"],
        "worst": report["worst"],
        "names": sorted(set(report["names"])),
        "pp": dims.coord("pp"),
        "sharded": sum(isinstance(p, DTensor) for _, p in named),
    }


def pipeline_worker(rank: int, world: int, cases: list) -> list[dict]:
    """:func:`pipeline_step` for several (arch, degrees, kwargs) cases in one spawn."""
    return run_cases(lambda arch, deg, kw: pipeline_step(world, arch, deg, **kw), cases)
