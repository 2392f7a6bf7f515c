"""Packed sequences under parallelism: one training step on two packs of samples with different
grids (sample boundaries cut by the CP / SP chunks, one pack padded) equals one process on the same
packs — loss and every gathered gradient, fp64, relative tolerance 1e-9 — under FSDP2 (dp over
packs), TP, TP+SP, CP ring (DiT, Llama-DiT), CP all-to-all and the ST-DiT hybrid (all-to-all for
spatial / temporal groups, ring for full attention), and TP x CP / FSDP x CP on 4 processes."""

from __future__ import annotations

import pytest
from packed_equivalence import packed_steps_worker
from parallel_harness import run_ranks

TOL = 1e-9

TWO = [
    ("dit", dict(dp_shard=2), {}),
    ("dit", dict(tp=2, dp_shard=1), dict(sequence_parallel=False)),
    ("dit", dict(tp=2, dp_shard=1), dict(sequence_parallel=True)),
    ("llama_dit", dict(tp=2, dp_shard=1), dict(sequence_parallel=True)),
    ("dit", dict(cp=2, dp_shard=1), dict(cp_mode="ring")),
    ("llama_dit", dict(cp=2, dp_shard=1), dict(cp_mode="ring")),
    ("dit_zero", dict(cp=2, dp_shard=1), dict(cp_mode="alltoall")),
    ("stdit", dict(cp=2, dp_shard=1), dict(cp_mode="alltoall")),
    ("stdit_mixed", dict(cp=2, dp_shard=1), dict(cp_mode="hybrid")),
    ("stdit_mixed", dict(tp=2, dp_shard=1), dict(activation_checkpointing=True)),
]

FOUR = [
    ("llama_dit", dict(tp=2, cp=2, dp_shard=1), dict(sequence_parallel=True, cp_mode="ring")),
    ("stdit_mixed", dict(tp=2, cp=2, dp_shard=1), dict(sequence_parallel=True, cp_mode="hybrid")),
    ("dit", dict(dp_shard=2, cp=2), dict(cp_mode="ring")),
]


def _check(results, label):
    for rank, r in enumerate(results):
        assert "error" not in r, f"{label} rank {rank}: {r.get('error')}"
        assert r["checked"] > 10 and r["nonfinite"] == [], (label, r)
        assert r["loss_err"] < TOL, f"{label} rank {rank}: loss rel. error {r['loss_err']:.2e}"
        assert r["grad_err"] < TOL, (
            f"{label} rank {rank}: grad rel. error {r['grad_err']:.2e} in {r['worst']}"
        )


@pytest.fixture(scope="module")
def two_process_results():
    """All 2-process cases in one spawn: results[rank]["cases"][case]."""
    return run_ranks(packed_steps_worker, 2, TWO)


@pytest.fixture(scope="module")
def four_process_results():
    return run_ranks(packed_steps_worker, 4, FOUR)


@pytest.mark.slow
@pytest.mark.parametrize("case", range(len(TWO)), ids=[str(c) for c in TWO])
def test_packed_two_process_step_equals_one_process(case, two_process_results):
    _check([r["cases"][case] for r in two_process_results], str(TWO[case]))


@pytest.mark.slow
@pytest.mark.parametrize("case", range(len(FOUR)), ids=[str(c) for c in FOUR])
def test_packed_four_process_step_equals_one_process(case, four_process_results):
    _check([r["cases"][case] for r in four_process_results], str(FOUR[case]))


@pytest.mark.slow
def test_pack_not_divisible_by_cp_names_the_sizes(two_process_results):
    """A pack of 45 tokens under cp=2 (same spawn): a clear error, not a hang or a shape crash."""
    for r in two_process_results:
        assert "45 tokens cannot be split evenly over 2 ranks" in r["uneven"], r["uneven"]
