"""``vfm plan --check``'s model states: the real model built under the real layout at world size
N in one process (fake process group, meta tensors) holds, on its busiest rank, the model-state
bytes the planner's memory model predicts: within 5% per component (parameters, gradients,
optimizer, EMA) for dit-7b and dit-28b on the paper's four layouts at 64 and 256 GPUs; bad
requests are one line, exit 2. (The traced step of ``--check``: tests/train/test_step_check.py.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from vfm_core.perf.memory import busiest_rank_params, param_count, rank_params
from vfm_core.recipes import get_recipe

PAPER = [  # recipe, tokens, pinned layout (Table 1)
    ("dit-7b", 8192, "tp=1,cp=2,pp=1"),
    ("dit-7b", 73728, "tp=4,sp=true,cp=4,pp=1"),
    ("dit-28b", 8192, "tp=2,sp=true,pp=2,cp=1"),
    ("dit-28b", 73728, "tp=8,sp=true,cp=4,pp=4"),
]
CHECKS = [
    (r, s, f, g) for r, s, f in PAPER for g in (64, 256) if not (f.endswith("pp=4") and g < 128)
]
CHECKS += [
    ("stdit-7b", 35840, "tp=2,sp=true,cp=2,pp=2,vpp=1", 64),
    ("ar-4b", 8192, "tp=4,sp=true,cp=2,pp=2", 64),
]

_SCRIPT = """
import dataclasses, json, sys
from vfm_core.perf.layout_rules import trainer_config
from vfm_core.perf.memory_check import busiest, check_report, measure_states, planned_states
from vfm_core.perf.planner import plan
from vfm_core.recipes import get_recipe
for recipe, seq, fixed, gpus in json.loads(sys.argv[1]):
    cfg = get_recipe(recipe)
    best = plan(cfg.model, seq_len=seq, gpus=gpus, fixed=fixed).plans[0]
    measured = measure_states(trainer_config(cfg, best.layout), gpus)
    rank, mine = busiest(measured)
    print(json.dumps({"recipe": recipe, "gpus": gpus, "layout": dataclasses.asdict(best.layout),
                      "components": check_report(mine, planned_states(best.memory)),
                      "per_pp_rank": [m.as_dict() for m in measured]}))
"""


def _vfm(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "vfm_core.cli", *args],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )


def test_rank_params_add_up_to_the_model_on_every_layout():
    for name in ("dit-7b", "stdit-7b", "llama-dit-7b", "ar-4b"):
        cfg = get_recipe(name).model
        assert rank_params(cfg) == param_count(cfg)
        for tp, pp, vpp in ((2, 1, 1), (1, 2, 1), (4, 4, 2)):
            per_rank = [rank_params(cfg, tp=tp, pp=pp, vpp=vpp, rank=r) for r in range(pp)]
            # every rank of a stage holds 1/tp of the split parts; replicas add to the sum
            assert sum(per_rank) * tp >= param_count(cfg) - 1
            assert busiest_rank_params(cfg, tp=tp, pp=pp, vpp=vpp) == max(per_rank)


@pytest.mark.slow
def test_plan_check_agrees_with_the_planner_on_the_paper_layouts():
    """One process measures every case (each at its own world size)."""
    proc = subprocess.run(
        [sys.executable, "-c", _SCRIPT, json.dumps(CHECKS)],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    reports = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert len(reports) == len(CHECKS)
    for (recipe, _seq, fixed, gpus), rep in zip(CHECKS, reports, strict=True):
        assert rep["recipe"] == recipe and rep["gpus"] == gpus
        lay = rep["layout"]
        for pin in fixed.split(","):
            key, value = pin.split("=")
            assert str(lay[key]).lower() == value, (recipe, fixed, lay)
        for key in ("params", "grads", "optimizer", "ema", "total"):
            row = rep["components"][key]
            assert row["measured_bytes"] > 0
            assert abs(row["rel_diff"]) <= 0.05, (recipe, fixed, gpus, key, row)
        assert len(rep["per_pp_rank"]) == lay["pp"]


def test_plan_check_refuses_bad_requests_in_one_line():
    cases = [
        (["--recipe", "dit-99b", "--seq", "8192", "--gpus", "8"], "dit-99b"),
        (["--recipe", "dit-7b", "--seq", "8192", "--gpus", "8", "--fixed", "tp=3"], "tp=3"),
        (["--recipe", "dit-7b", "--seq", "8192", "--gpus", "6", "--fixed", "tp=4,cp=2"], "6"),
        (["--recipe", "dit-7b", "--seq", "8192", "--gpus", "8", "--fixed", "pp=2,vpp=3"], "vpp"),
    ]
    for args, named in cases:
        r = _vfm("plan", "--check", *args)
        assert r.returncode == 2, (args, r.stdout[-500:], r.stderr[-2000:])
        assert r.stderr.strip().count("\n") == 0 and named in r.stderr, (args, r.stderr)
        assert r.stdout == ""
