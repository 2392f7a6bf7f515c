"""One trainer, every layout: the one-process run and the same run under each layout give the
same loss at every step (fp32, relative 1e-4). On 2 ranks: every preset (DiT, ST-DiT, Llama-DiT,
the autoregressive ar-tiny) under each plain degree (DDP, FSDP2, TP with and without SP, CP, PP),
and packed autoregressive training under TP and under CP. On 4 ranks, pipeline parallelism
combined with every other degree (the paper's 4D layouts): PP x CP and PP x TP (DiT, ST-DiT, the
autoregressive family), interleaved 1F1B over virtual stages, packs through PP x TP, gradient
accumulation under PP x FSDP2. Every rank builds its part of the model on the meta device and
materialises only its shards, yet the gathered initial weights equal the one-process model's
exactly, and the EMA is sharded like the parameters. The full TP x SP x CP x PP on 8 ranks
through ``vfm train`` (packed), and its checkpoint resumed by one process, are in the last test.
All one-process references (and the one-process resume) run in the test's own process, each rank
count's cases in one spawn."""

from __future__ import annotations

import json

import pytest
import torch
from parallel_harness import (
    TINY_RUN,
    build_trainer,
    fit_collect,
    launch_ok,
    one_process,
    resume_trainer,
    run_ranks,
    set_args,
    vfm_argv,
)

from vfm_core.config import apply_overrides
from vfm_core.recipes import get_recipe

STEPS = 3
TOL = 1e-4
SMALL = [*TINY_RUN, "train.seed=5", "train.device=cpu", "tracking.mlflow=false"]
SMALL.append(f"train.steps={STEPS}")
INTERLEAVED = [
    "model.depth=4",
    "parallel.pp_schedule=interleaved_1f1b",
    "parallel.pp_virtual_stages=2",
]
CP2PP2, TP2PP2 = dict(cp=2, pp=2, dp_shard=1), dict(tp=2, pp=2, dp_shard=1)
# (recipe, degrees on 4 ranks, overrides; "packs" / "tokens": the shard fixtures)
FOUR = [
    ("dit-tiny", CP2PP2, []),
    ("dit-tiny", TP2PP2, []),
    ("dit-tiny", CP2PP2, INTERLEAVED),
    ("stdit-tiny", CP2PP2, []),
    ("ar-tiny", TP2PP2, []),
    ("ar-tiny", CP2PP2, []),
    ("dit-tiny", TP2PP2, ["packs"]),
    ("dit-tiny", dict(pp=2, dp_shard=2), ["data.batch_size=8", "train.grad_accum=2"]),
]
TWO = [
    ("dit-tiny", dict(dp_replicate=2), []),
    ("dit-tiny", dict(tp=2), ["parallel.sequence_parallel=false"]),
    ("stdit-tiny", dict(cp=2), []),
    ("stdit-tiny", dict(pp=2), []),
    ("llama-dit-tiny", dict(tp=2), []),
    ("llama-dit-tiny", dict(dp_shard=2), []),
    # the autoregressive family: FSDP2, balanced causal ring CP, TP+SP (vocabulary-parallel head
    # and loss), PP; then packed token shards
    ("ar-tiny", dict(dp_shard=2), []),
    ("ar-tiny", dict(cp=2), []),
    ("ar-tiny", dict(tp=2), []),
    ("ar-tiny", dict(pp=2), []),
    ("ar-tiny", dict(tp=2), ["tokens"]),
    ("ar-tiny", dict(cp=2), ["tokens"]),
    ("ar-tiny", dict(cp=2), ["tokens", "model.text_conditioning=pooled"]),  # the caption's mean
]
LAYOUT_ONLY = ("parallel.", "train.grad_accum")


def _config(recipe: str, overrides: list[str], data: dict):
    sets = list(SMALL)
    for o in overrides:
        sets += data[o] if o in data else [o]
    return apply_overrides(get_recipe(recipe), sets)


def _reference_key(recipe: str, overrides: list[str]) -> str:
    """One-process runs are shared by the cases that differ only in layout settings."""
    return json.dumps([recipe, [o for o in overrides if not o.startswith(LAYOUT_ONLY)]])


def _initial_weights_error(trainer) -> float:
    """max |gathered initial weight - one-process initial weight| over this rank's parameters."""
    from torch.distributed.tensor import DTensor

    from vfm_core.families import build_model

    ref = dict(build_model(trainer.cfg.model, seed=trainer.cfg.train.seed).named_parameters())
    worst = 0.0
    for name, p in trainer.layout.named_parameters():
        full = p.full_tensor() if isinstance(p, DTensor) else p
        worst = max(worst, (full.detach() - ref[name]).abs().max().item())
    return worst


def _fit_cases(rank: int, world: int, cases: list, data: dict) -> list[dict]:
    from torch.distributed.tensor import DTensor

    out = []
    for recipe, degrees, overrides in cases:
        tr = build_trainer(_config(recipe, overrides, data), world, degrees)
        init = _initial_weights_error(tr)
        ema = tr.ema.state_dict()  # a shard of every sharded parameter, never a full copy
        like = all(
            isinstance(ema[n], DTensor) == isinstance(p, DTensor)
            and (ema[n].to_local() if isinstance(p, DTensor) else ema[n]).shape
            == (p.to_local() if isinstance(p, DTensor) else p).shape
            for n, p in tr.layout.named_parameters()
        )
        out.append({"losses": fit_collect(tr).losses, "init_err": init, "ema_sharded": like})
    return out


@pytest.fixture(scope="module")
def data(mixed_shards, token_shards, tmp_path_factory) -> dict:
    packs = mixed_shards.write(tmp_path_factory.mktemp("mixed"), seed=1)
    root, tok = token_shards
    return {
        "packs": [
            "data.source=shards",
            f"data.shards={packs}",
            "data.max_tokens=32",
            "data.batch_size=4",
            "model.text_dim=16",
        ],
        "tokens": [
            "data.source=shards",
            f"data.shards={root / 'dst'}",
            f"data.tokenizer={tok}",
            "data.max_tokens=400",
            "data.batch_size=2",
            "model.text_dim=384",
        ],
    }


@pytest.fixture(scope="module")
def references(data) -> dict:
    """One process, every distinct run of the cases (this process)."""
    runs = {}
    for recipe, _, overrides in FOUR + TWO:
        runs.setdefault(
            _reference_key(recipe, overrides),
            (recipe, {}, [o for o in overrides if not o.startswith(LAYOUT_ONLY)]),
        )
    keys = list(runs)
    rows = one_process(_fit_cases, [runs[k] for k in keys], data)
    for row in rows:
        assert row["init_err"] == 0.0 and len(row["losses"]) == STEPS
    return {k: row["losses"] for k, row in zip(keys, rows, strict=True)}


def _check(cases, results, references) -> None:
    for i, (recipe, degrees, overrides) in enumerate(cases):
        want = references[_reference_key(recipe, overrides)]
        for rank, r in enumerate(results):
            got = r[i]["losses"]
            assert r[i]["init_err"] == 0.0, (recipe, degrees, overrides, rank, r[i]["init_err"])
            assert r[i]["ema_sharded"], (recipe, degrees, overrides)
            if rank == 0:
                for step, (g, w) in enumerate(zip(got, want, strict=True), start=1):
                    assert abs(g - w) <= TOL * abs(w), (recipe, degrees, overrides, step, got, want)


@pytest.mark.slow
def test_4_rank_pipelines_train_the_one_process_run(data, references):
    _check(FOUR, run_ranks(_fit_cases, 4, FOUR, data), references)


@pytest.mark.slow
def test_2_rank_layouts_of_every_preset_train_the_one_process_run(data, references):
    _check(TWO, run_ranks(_fit_cases, 2, TWO, data), references)


def _resume_fit(rank: int, world: int, config, checkpoint: str) -> list[float]:
    tr = build_trainer(config, world, {})
    resume_trainer(tr, checkpoint)
    return fit_collect(tr).losses


@pytest.mark.slow
def test_vfm_train_8_rank_4d_packed_and_its_checkpoint_resumes_in_one_process(data, tmp_path):
    """``vfm train --nproc 8 --tp 2 --cp 2 --pp 2`` on packs: the one-process losses; its step-2
    checkpoint continues in one process with the one-process losses of steps 3 and 4."""
    sets = [*SMALL, *data["packs"], "data.batch_size=2", "train.steps=4", "train.ckpt_every=2"]
    one = one_process(_fit_cases, [("dit-tiny", {}, sets)], {})[0]["losses"]
    out = tmp_path / "4d"
    argv = vfm_argv(
        "train",
        "--recipe",
        "dit-tiny",
        "--out",
        out,
        "--steps",
        4,
        "--nproc",
        8,
        "--tp",
        2,
        "--cp",
        2,
        "--pp",
        2,
        *set_args(sets),
    )
    rows = launch_ok(argv, out, timeout=600)
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    for row, w in zip(rows, one, strict=True):
        assert abs(row["loss"] - w) <= TOL * abs(w), (rows, one)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["degrees"] == {"pp": 2, "dp_replicate": 1, "dp_shard": 1, "cp": 2, "tp": 2}
    cfg = apply_overrides(get_recipe("dit-tiny"), sets)
    got = one_process(_resume_fit, cfg, str(out / "checkpoints" / "step_00000002"))
    assert len(got) == 2
    for g, w in zip(got, one[2:], strict=True):
        assert abs(g - w) <= TOL * abs(w), (got, one)
    assert torch.isfinite(torch.tensor(got)).all()
