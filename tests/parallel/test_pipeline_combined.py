"""Pipeline parallelism combined with other degrees on 4 gloo ranks equals one process: one EDM step
under PP2 x FSDP2 (dp_shard=2), PP2 x HSDP (dp_replicate=2) and PP2 x TP2 (with and without sequence
parallel) gives the loss of the global batch and the gathered gradient of every parameter of every
stage that one process computes on the same global batch (fp64, relative tolerance 1e-9), for DiT,
ST-DiT and Llama-DiT. Each data-parallel rank feeds its own slice of the batch through its pipeline.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from equivalence import GLOBAL_BATCH, LATENT, grad_report, reference_step, run_cases, tiny_model_cfg
from parallel_harness import run_ranks
from torch.distributed.tensor import DTensor

from vfm_core.models.dit import build_model
from vfm_core.parallel.dims import ParallelDims

TOL = 1e-9
GRID = (LATENT[1], LATENT[2] // 2, LATENT[3] // 2)  # patch (1, 2, 2)
FSDP = dict(pp=2, dp_shard=2)
HSDP = dict(pp=2, dp_replicate=2, dp_shard=1)
TP = dict(pp=2, tp=2, dp_shard=1)
# (arch, degrees, schedule, microbatches per data-parallel rank, sequence_parallel)
CASES = [
    ("dit", FSDP, "1f1b", 2, True),
    ("stdit", FSDP, "gpipe", 2, True),
    ("llama_dit", FSDP, "gpipe", 2, True),
    ("dit", HSDP, "1f1b", 2, True),
    ("dit", TP, "1f1b", 2, True),
    ("dit", TP, "gpipe", 4, False),
    ("stdit", TP, "1f1b", 2, True),
    ("llama_dit", TP, "1f1b", 2, True),
]


def _case(world: int, arch: str, degrees: dict, schedule: str, micro: int, sp: bool) -> dict:
    from vfm_core.parallel.pipeline import DiTPipeline, sync_pipeline_grads

    edm, ref, model, (x0, text, sigma, noise), ref_loss = reference_step(arch)

    dims = ParallelDims(**degrees, world_size=world)
    pipe = DiTPipeline(
        model,
        parallel_dims=dims,
        grid=GRID,
        microbatches=micro,
        schedule=schedule,
        sequence_parallel=sp,
    )
    b = GLOBAL_BATCH // dims.dp
    sl = slice(dims.dp_rank() * b, (dims.dp_rank() + 1) * b)
    loss = pipe.step(edm, x0[sl], text[sl], sigma=sigma[sl], noise=noise[sl])
    sync_pipeline_grads(pipe)
    # the last stage's ranks (dp x tp of them) hold their slice's loss; the rest add 0
    total = (loss if loss is not None else torch.zeros((), dtype=torch.float64)).clone()
    dist.all_reduce(total)
    loss_err = abs(total.item() / (world // dims.pp) / ref_loss.item() - 1)

    # gathering a sharded gradient is a collective over this stage's dp x tp ranks (same order)
    report = grad_report(pipe.module.named_parameters(), ref)
    n_sharded = sum(isinstance(p, DTensor) for p in pipe.module.parameters())
    return {
        "loss_err": loss_err,
        "has_loss": loss is not None,
        "grad_err": report["grad_err"],
        "worst": report["worst"],
        "names": report["names"],
        "pp": dims.coord("pp"),
        "sharded": n_sharded,
    }


def combined_worker(rank: int, world: int, cases: list) -> list[dict]:
    return run_cases(lambda *case: _case(world, *case), cases)


@pytest.fixture(scope="module")
def results():
    """All cases in one 4-process spawn: results[rank][case]."""
    return run_ranks(combined_worker, 4, CASES)


@pytest.mark.slow
@pytest.mark.parametrize("case", range(len(CASES)), ids=[str(c) for c in CASES])
def test_pipeline_combined_step_equals_one_process(case, results):
    arch, degrees, *_ = CASES[case]
    rows = [r[case] for r in results]
    for rank, r in enumerate(rows):
        assert "error" not in r, f"rank {rank}: {r['error']}"
        assert r["loss_err"] < TOL, (rank, r["loss_err"])
        assert r["grad_err"] < TOL, (rank, r["grad_err"], r["worst"])
        assert r["sharded"] > 0  # FSDP / TP really sharded this stage
    # the mesh is (pp, dp_replicate, dp_shard, cp, tp): ranks 0, 1 are stage 0, ranks 2, 3 stage 1
    assert [r["pp"] for r in rows] == [0, 0, 1, 1]
    assert [r["has_loss"] for r in rows] == [False, False, True, True]
    assert rows[0]["names"] == rows[1]["names"] and rows[2]["names"] == rows[3]["names"]
    n_params = len(list(build_model(tiny_model_cfg(arch)).parameters()))
    assert len(set(rows[0]["names"]) | set(rows[2]["names"])) == n_params
