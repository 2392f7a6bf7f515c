"""Pipeline parallelism (2 stages, GPipe and 1F1B, conditioning recomputed per stage) equals one
process: loss on the last stage and the gradient of every parameter on every stage (fp64, relative
tolerance 1e-9); every block lives on exactly one stage."""

from __future__ import annotations

import pytest
from equivalence import pipeline_worker, tiny_model_cfg
from parallel_harness import run_ranks

from vfm_core.config import ConfigError
from vfm_core.models.dit import build_model
from vfm_core.parallel.dims import ParallelDims
from vfm_core.parallel.pipeline import DiTPipeline, stage_blocks

TOL = 1e-9
CASES = [("dit", "gpipe", 2), ("stdit", "1f1b", 4), ("llama_dit", "1f1b", 2)]


def test_stage_blocks_split_contiguously():
    assert [stage_blocks(5, 2, s) for s in range(2)] == [["0", "1", "2"], ["3", "4"]]
    assert sum((stage_blocks(7, 3, s) for s in range(3)), []) == [str(i) for i in range(7)]
    with pytest.raises(ConfigError, match="3 stages need at least 3 blocks, depth is 2"):
        stage_blocks(2, 3, 0)


@pytest.mark.slow
def test_two_stage_pipeline_step_equals_one_process():
    results = run_ranks(pipeline_worker, 2, CASES)
    n_params = {a: len(list(build_model(tiny_model_cfg(a)).parameters())) for a, *_ in CASES}
    for i, (arch, schedule, _) in enumerate(CASES):
        first, last = results[0][i], results[1][i]
        assert first["loss_err"] is None and last["loss_err"] < TOL, (arch, last["loss_err"])
        for r in (first, last):
            assert r["grad_err"] < TOL, (arch, schedule, r["grad_err"], r["worst"])
        held = set(first["names"]) | set(last["names"])
        assert len(held) == n_params[arch]  # every parameter lives on some stage
        shared = set(first["names"]) & set(last["names"])
        assert shared and all(n.startswith(("t_embedder.", "adaln_global.")) for n in shared)


def test_pipeline_names_what_it_cannot_run():
    model = build_model(tiny_model_cfg("dit"))
    grid = (4, 4, 4)
    bad = [
        (dict(pp=2, cp=2, world_size=4), {}, "combining PP with context parallelism"),
        (dict(pp=2, world_size=2), dict(schedule="zb"), "pipeline schedule 'zb' unknown"),
        (dict(pp=2, world_size=2), dict(microbatches=1), "1 is too few for the '1f1b' schedule"),
        (dict(world_size=1), {}, "parallel.pp must be >= 2"),
    ]
    for degrees, options, message in bad:
        kw = {"microbatches": 2, **options}
        with pytest.raises(ConfigError, match=message):
            DiTPipeline(model, parallel_dims=ParallelDims(**degrees), grid=grid, **kw)
