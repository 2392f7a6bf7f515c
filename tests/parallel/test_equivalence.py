"""N-process training step == 1-process step on the same global batch (loss and every gathered
gradient), fp64, relative tolerance 1e-9, for DiT, ST-DiT and Llama-DiT under FSDP2, TP, TP+SP,
CP-ring, CP-all-to-all (ST-DiT hybrid) and their 4-process combinations."""

from __future__ import annotations

import pytest
from equivalence import steps_worker
from parallel_harness import run_ranks

TOL = 1e-9

TWO = [
    ("dit", dict(dp_shard=2), {}),
    ("dit", dict(tp=2, dp_shard=1), dict(sequence_parallel=False)),
    ("dit", dict(tp=2, dp_shard=1), dict(sequence_parallel=True)),
    ("dit_zero", dict(tp=2, dp_shard=1), dict(sequence_parallel=True)),
    ("llama_dit", dict(tp=2, dp_shard=1), dict(sequence_parallel=True)),
    ("dit", dict(cp=2, dp_shard=1), dict(cp_mode="ring")),
    ("llama_dit", dict(cp=2, dp_shard=1), dict(cp_mode="ring")),
    ("dit", dict(cp=2, dp_shard=1), dict(cp_mode="alltoall")),
    ("stdit", dict(cp=2, dp_shard=1), dict(cp_mode="hybrid")),
    ("stdit", dict(tp=2, dp_shard=1), dict(sequence_parallel=True, activation_checkpointing=True)),
    ("dit_pooled", dict(tp=2, dp_shard=1), dict(sequence_parallel=True)),
    ("dit_pooled", dict(cp=2, dp_shard=1), dict(cp_mode="ring")),
    ("llama_fused", dict(tp=2, dp_shard=1), dict(sequence_parallel=True)),
]

FOUR = [
    ("dit", dict(dp_shard=2, tp=2), dict(sequence_parallel=True)),
    ("dit", dict(dp_shard=2, cp=2), dict(cp_mode="ring")),
    ("llama_dit", dict(tp=2, cp=2, dp_shard=1), dict(sequence_parallel=True, cp_mode="ring")),
    ("llama_fused", dict(dp_shard=2, tp=2), dict(sequence_parallel=True)),
    ("stdit", dict(tp=2, cp=2, dp_shard=1), dict(sequence_parallel=True, cp_mode="hybrid")),
    ("dit", dict(dp_replicate=2, dp_shard=2), {}),
    ("stdit", dict(dp_replicate=2, cp=2, dp_shard=1), dict(cp_mode="hybrid")),
]


@pytest.fixture(scope="module")
def two_process_results():
    """All 2-process cases in one spawn: results[rank][case]."""
    return run_ranks(steps_worker, 2, TWO)


@pytest.fixture(scope="module")
def four_process_results():
    return run_ranks(steps_worker, 4, FOUR)


def _check(results, label):
    for rank, r in enumerate(results):
        assert "error" not in r, f"{label} rank {rank}: {r.get('error')}"
        assert r["checked"] > 10
        assert r["loss_err"] < TOL, f"{label} rank {rank}: loss rel. error {r['loss_err']:.2e}"
        assert r["grad_err"] < TOL, (
            f"{label} rank {rank}: grad rel. error {r['grad_err']:.2e} in {r['worst']}"
        )


@pytest.mark.slow
@pytest.mark.parametrize("case", range(len(TWO)), ids=[str(c) for c in TWO])
def test_two_process_step_equals_one_process(case, two_process_results):
    _check([r["cases"][case] for r in two_process_results], str(TWO[case]))


@pytest.mark.slow
@pytest.mark.parametrize("case", range(len(FOUR)), ids=[str(c) for c in FOUR])
def test_four_process_step_equals_one_process(case, four_process_results):
    _check([r["cases"][case] for r in four_process_results], str(FOUR[case]))


@pytest.mark.slow
def test_named_mesh_puts_tp_innermost(four_process_results):
    """ParallelDims on 4 ranks with tp=2 (dp_shard inferred = 2), from the same spawn."""
    out = [r["mesh"] for r in four_process_results]
    assert out[0]["names"] == ["pp", "dp_replicate", "dp_shard", "cp", "tp"]
    assert [o["tp"] for o in out] == [0, 1, 0, 1]
    assert [o["dp"] for o in out] == [0, 0, 1, 1]
    assert all(o["cp"] == 0 for o in out)
    assert [o["tp_ranks"] for o in out] == [[0, 1], [0, 1], [2, 3], [2, 3]]
    assert [o["dp_ranks"] for o in out] == [[0, 2], [1, 3], [0, 2], [1, 3]]
