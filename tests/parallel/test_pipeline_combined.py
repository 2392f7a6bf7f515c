"""Pipeline parallelism combined with every other degree equals one process: one EDM step under
PP2 x FSDP2, PP2 x HSDP, PP2 x TP2 (with and without sequence parallel), PP2 x CP2 (ring,
all-to-all, ST-DiT hybrid; interleaved stages too) on 4 gloo ranks, and the full
TP2 x SP x CP2 x PP2 on 8, gives the loss of the global batch and the gathered gradient of every
parameter of every stage that one process computes on the same global batch (fp64, relative
tolerance 1e-9), for DiT, ST-DiT and Llama-DiT. Each data-parallel rank feeds its own slice of the
batch through its pipeline; context-parallel ranks each run their chunk of the sequence."""

from __future__ import annotations

import pytest
from equivalence import pipeline_worker, tiny_model_cfg
from parallel_harness import run_ranks

from vfm_core.families import build_model

TOL = 1e-9
FSDP = dict(pp=2, dp_shard=2)
HSDP = dict(pp=2, dp_replicate=2, dp_shard=1)
TP = dict(pp=2, tp=2, dp_shard=1)
CP = dict(pp=2, cp=2, dp_shard=1)
SP, NO_SP = dict(sequence_parallel=True), dict(sequence_parallel=False)
RING, A2A, HYBRID = (dict(cp_mode=m) for m in ("ring", "alltoall", "hybrid"))
CASES = [
    ("dit", FSDP, dict(schedule="1f1b", options=SP)),
    ("stdit", FSDP, dict(schedule="gpipe", options=SP)),
    ("dit", HSDP, dict(schedule="1f1b")),
    ("dit", TP, dict(schedule="gpipe", micro=4, options=NO_SP)),
    ("stdit", TP, dict(options=SP)),
    ("llama_dit", TP, dict(options=SP)),
    ("dit", CP, dict(options=RING)),
    ("llama_dit", CP, dict(options=RING)),
    ("dit", CP, dict(options=A2A)),
    ("stdit", CP, dict(options=HYBRID)),
    ("dit", CP, dict(schedule="interleaved_1f1b", virtual=2, depth=4, options=RING)),
]
FOUR_D = [("dit", dict(pp=2, tp=2, cp=2, dp_shard=1), dict(options={**SP, **RING}))]


def _check(rows: list[dict], case: tuple, stages: list[int]) -> None:
    arch, _, kw = case
    for rank, r in enumerate(rows):
        assert "error" not in r, f"{case} rank {rank}: {r['error']}"
        assert r["loss_err"] < TOL, (case, rank, r["loss_err"])
        assert r["grad_err"] < TOL, (case, rank, r["grad_err"], r["worst"])
        assert r["sharded"] > 0  # FSDP / TP / CP really sharded this stage
    # the mesh is (pp, dp_replicate, dp_shard, cp, tp): the first half of the ranks is stage 0
    assert [r["pp"] for r in rows] == stages
    assert [r["has_loss"] for r in rows] == [s == 1 for s in stages]
    n_params = len(list(build_model(tiny_model_cfg(arch, depth=kw.get("depth", 2))).parameters()))
    assert len(set(rows[0]["names"]) | set(rows[-1]["names"])) == n_params


@pytest.fixture(scope="module")
def results():
    """All 4-rank cases in one spawn: results[rank][case]."""
    return run_ranks(pipeline_worker, 4, CASES)


@pytest.mark.slow
@pytest.mark.parametrize("case", range(len(CASES)), ids=[str(c) for c in CASES])
def test_pipeline_combined_step_equals_one_process(case, results):
    _check([r[case] for r in results], CASES[case], [0, 0, 1, 1])


@pytest.mark.slow
def test_4d_tp_sp_cp_pp_step_equals_one_process():
    """The paper's full 4D layout (TP x SP x CP x PP) on 8 ranks, tiny model."""
    rows = [r[0] for r in run_ranks(pipeline_worker, 8, FOUR_D)]
    _check(rows, FOUR_D[0], [0] * 4 + [1] * 4)
