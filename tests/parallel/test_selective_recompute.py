"""Selective activation checkpointing under 2-process layouts (gloo, CPU, fp64): one training step
equals the 1-process step without checkpointing (loss and every gathered gradient, 1e-9) under
FSDP2, TP+SP and ring CP — the layouts the planner proposes with ``recompute=selective``."""

from __future__ import annotations

import pytest
from equivalence import steps_worker
from parallel_harness import run_ranks

CASES = [
    ("dit", dict(dp_shard=2), dict(activation_checkpointing="selective")),
    (
        "llama_dit",
        dict(tp=2, dp_shard=1),
        dict(sequence_parallel=True, activation_checkpointing="selective"),
    ),
    ("dit", dict(cp=2, dp_shard=1), dict(cp_mode="ring", activation_checkpointing="selective")),
    ("stdit", dict(cp=2, dp_shard=1), dict(cp_mode="hybrid", activation_checkpointing="selective")),
]


@pytest.mark.slow
def test_selective_recompute_two_processes_equal_one():
    results = run_ranks(steps_worker, 2, CASES)
    for case, label in enumerate(CASES):
        for rank, r in enumerate(x["cases"][case] for x in results):
            assert "error" not in r, f"{label} rank {rank}: {r.get('error')}"
            assert r["loss_err"] < 1e-9, (label, rank, r["loss_err"])
            assert r["grad_err"] < 1e-9, (label, rank, r["grad_err"], r["worst"])
