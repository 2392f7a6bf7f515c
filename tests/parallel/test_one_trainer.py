"""One trainer: ``vfm train`` in one process and ``vfm train --nproc 2`` under each layout train the
same run — the same loss at every step (fp32, relative 1e-4) for the DiT, ST-DiT and Llama-DiT
presets and the autoregressive ar-tiny. (Shards, packs, TP x CP, PP x FSDP2 and resharding have
their own files here.)"""

from __future__ import annotations

import pytest
from parallel_harness import TINY_RUN, launch_ok, set_args, vfm_argv

STEPS = 3
SMALL = TINY_RUN

# (preset, layouts run against its one-process run)
CASES = {
    "dit-tiny": [
        ["--dp-replicate", "2"],
        ["--tp", "2", "--set", "parallel.sequence_parallel=false"],
    ],
    "stdit-tiny": [["--cp", "2"], ["--pp", "2"]],
    "llama-dit-tiny": [["--tp", "2"], ["--dp-shard", "2"]],
    # the autoregressive family on the same trainer: FSDP2, balanced causal ring CP, TP+SP
    # (vocabulary-parallel head and loss), PP
    "ar-tiny": [["--dp-shard", "2"], ["--cp", "2"], ["--tp", "2"], ["--pp", "2"]],
}


def _train(out, recipe, *extra):
    argv = vfm_argv(
        "train",
        "--recipe",
        recipe,
        "--steps",
        STEPS,
        "--seed",
        5,
        "--no-mlflow",
        "--out",
        out,
        *set_args(SMALL),
        *extra,
    )
    return [r["loss"] for r in launch_ok(argv, out)]


@pytest.mark.slow
@pytest.mark.parametrize("recipe", list(CASES))
def test_one_process_and_two_process_layouts_train_the_same_run(recipe, tmp_path):
    one = _train(tmp_path / "one", recipe)
    assert len(one) == STEPS
    for i, layout in enumerate(CASES[recipe]):
        got = _train(tmp_path / f"layout{i}", recipe, "--nproc", "2", *layout)
        for step, (g, w) in enumerate(zip(got, one, strict=True), start=1):
            assert abs(g - w) <= 1e-4 * abs(w), (recipe, layout, step, got, one)
