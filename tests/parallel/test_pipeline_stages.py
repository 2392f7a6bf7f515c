"""Pipeline parallelism on 2 ranks (GPipe, 1F1B, interleaved 1F1B with 2 virtual stages per rank,
conditioning recomputed per stage) equals one process: loss on the last stage and the gradient of
every parameter on every stage (fp64, relative tolerance 1e-9); every block lives on exactly one
stage, stages keep the one-process names."""

from __future__ import annotations

import dataclasses

import pytest
from equivalence import pipeline_worker, tiny_model_cfg
from parallel_harness import run_ranks

from vfm_core.config import ConfigError
from vfm_core.families import build_model
from vfm_core.models.dit import DiT
from vfm_core.parallel.pipeline import replicated, split_stage, stage_blocks

TOL = 1e-9
PP2 = dict(pp=2, dp_shard=1)
CASES = [
    ("dit", PP2, dict(schedule="gpipe", micro=2)),
    ("stdit", PP2, dict(schedule="1f1b", micro=4)),
    ("llama_dit", PP2, dict(schedule="1f1b", micro=2)),
    ("dit", PP2, dict(schedule="interleaved_1f1b", micro=2, virtual=2, depth=4)),
    ("dit_pooled", PP2, dict(schedule="1f1b", micro=2)),  # the caption's replica per stage
]


def test_stage_blocks_split_contiguously():
    assert [stage_blocks(5, 2, s) for s in range(2)] == [["0", "1", "2"], ["3", "4"]]
    assert sum((stage_blocks(7, 3, s) for s in range(3)), []) == [str(i) for i in range(7)]
    with pytest.raises(ConfigError, match="3 pipeline stages need at least 3 blocks, depth is 2"):
        stage_blocks(2, 3, 0)


@pytest.mark.parametrize("text", ["cross", "pooled"])
@pytest.mark.parametrize("arch", ["dit", "ar"])
def test_split_stage_keeps_names_and_parts(arch, text):
    cfg = tiny_model_cfg("dit", depth=4, text_conditioning=text)
    if arch == "ar":
        cfg = dataclasses.replace(cfg, arch="ar", vocab_size=50, patch=(1, 1, 1))
    model = build_model(cfg, device="meta")
    names = {n for n, _ in model.named_parameters()}
    parts = [split_stage(model, stage=s, stages=4) for s in range(4)]
    held = [{n for n, _ in p.named_parameters()} for p in parts]
    assert set().union(*held) == names  # every parameter on some stage, under its own name
    first, last = model.STAGE_FIRST[0], model.STAGE_LAST[-1]
    assert [getattr(p, first) is not None for p in parts] == [True, False, False, False]
    assert [getattr(p, last) is not None for p in parts] == [False, False, False, True]
    assert [list(p.blocks) for p in parts] == [["0"], ["1"], ["2"], ["3"]]
    # the pooled caption: a replica on every DiT stage (like the timestep MLP), the causal
    # model's on its first stage (it enters with the embedding)
    if text == "pooled":
        on = [p.text_embedder is not None for p in parts]
        assert on == ([True] * 4 if arch == "dit" else [True, False, False, False])


@pytest.mark.slow
def test_two_stage_pipeline_step_equals_one_process():
    results = run_ranks(pipeline_worker, 2, CASES)
    for i, (arch, _, kw) in enumerate(CASES):
        first, last = results[0][i], results[1][i]
        for r in (first, last):
            assert "error" not in r, (arch, kw, r.get("error"))
            assert r["grad_err"] < TOL, (arch, kw, r["grad_err"], r["worst"])
        assert not first["has_loss"] and last["loss_err"] < TOL, (arch, kw, last["loss_err"])
        depth = kw.get("depth", 2)
        n_params = len(list(build_model(tiny_model_cfg(arch, depth=depth)).parameters()))
        assert len(set(first["names"]) | set(last["names"])) == n_params
        shared = set(first["names"]) & set(last["names"])
        assert shared and all(n.startswith(replicated(DiT)) for n in shared)
