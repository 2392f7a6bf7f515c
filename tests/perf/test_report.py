"""The scaling study's derived columns: the planner calibrated on the 1-process row reproduces
that row, even when a CPU shared with other work ran it at a few percent of its measured GEMM peak
(the fit's floor once stopped ~9x above such a row)."""

from __future__ import annotations

import dataclasses

import pytest

from vfm_core.perf.report import StudyRow, add_derived
from vfm_core.recipes import get_recipe


@pytest.mark.parametrize("per_proc", [70.0, 700.0, 7000.0])
def test_calibrated_prediction_reproduces_the_one_process_row(per_proc):
    model = dataclasses.asdict(
        dataclasses.replace(get_recipe("dit-tiny").model, hidden=64, depth=2, heads=4)
    )
    row = dict(
        recipe="dit-tiny",
        tflops=0.0,
        mfu=0.0,
        hardware="cpu",
        model=model,
        seq=32,
        peak_flops=1.5e11,
        batch=2,
    )
    rows = add_derived(
        [
            StudyRow(
                run_id="a",
                layout="1proc",
                world=1,
                degrees={},
                tokens_per_s=per_proc,
                per_proc=per_proc,
                **row,
            ),
            StudyRow(
                run_id="b",
                layout="dp_shard2",
                world=2,
                degrees={"dp_shard": 2},
                tokens_per_s=1.6 * per_proc,
                per_proc=0.8 * per_proc,
                **row,
            ),
        ]
    )
    one, two = rows
    assert one.scaling_eff == pytest.approx(1.0) and two.scaling_eff == pytest.approx(0.8)
    assert one.predicted == pytest.approx(per_proc, rel=0.05)
    assert two.predicted is not None and two.predicted > 0
