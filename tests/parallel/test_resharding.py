"""DCP resharding: a checkpoint saved under TP2 (model, EMA, AdamW moments, schedule, data
position, step) resumes under FSDP2 and in one process with the same next losses as the run that
never stopped (same global batch; fp32, relative tolerance 1e-5); a new run started from it
(``train.init``: weights and EMA only) holds its weights under FSDP2 and in one process alike and
takes the same first step in both. (Each one-process case runs in the test's own process.)"""

from __future__ import annotations

import pytest
from parallel_harness import build_trainer, fit_collect, one_process, run_ranks

from vfm_core.config import apply_overrides, save_yaml
from vfm_core.recipes import get_recipe

TOL = 1e-5
GLOBAL_BATCH = 4
TINY = [
    "model.hidden=64",
    "model.depth=2",
    "model.text_dim=32",
    "data.latent_height=8",
    "data.latent_width=8",
    "train.device=cpu",
    "optim.warmup_steps=2",
    "optim.lr=0.002",
    "tracking.mlflow=false",
]


def _cfg(steps, *extra):
    over = [*TINY, f"train.steps={steps}", f"data.batch_size={GLOBAL_BATCH}", *extra]
    return apply_overrides(get_recipe("dit-tiny"), over)


def _trainer(world, degrees, steps, *extra):
    return build_trainer(_cfg(steps, *extra), world, degrees)


def _save_then_continue(rank, world, root):
    from vfm_core.checkpoints.manager import CheckpointManager, save_trainer

    ckpt = CheckpointManager(root)
    tr = _trainer(world, dict(tp=2, dp_shard=1), steps=2)
    tr.fit(loggers=[], checkpoint=lambda t: save_trainer(ckpt, t))
    tr.cfg.train.steps = 4
    return fit_collect(tr).losses


def _resume(rank, world, root, degrees):
    from vfm_core.checkpoints.manager import CheckpointManager, load_trainer

    tr = _trainer(world, degrees, steps=4)
    path = load_trainer(CheckpointManager(root), tr)
    assert tr.step == 2, tr.step
    return {"path": path.name, "losses": fit_collect(tr).losses}


def _init_then_step(rank, world, root, degrees):
    from vfm_core.checkpoints.init import start_from_init

    tr = _trainer(world, degrees, 1, f"train.init={root}")
    start_from_init(tr)
    full = {n: getattr(p, "full_tensor", p.detach)() for n, p in tr.layout.named_parameters()}
    sums = {n: float(p.detach().double().sum()) for n, p in sorted(full.items())}
    return {"step": tr.step, "sums": sums, "losses": fit_collect(tr).losses}


def _resume_wrong_model(rank, world, root):
    from vfm_core.checkpoints.manager import CheckpointError, CheckpointManager, load_trainer

    cfg = apply_overrides(get_recipe("dit-tiny"), [*TINY, "model.depth=3"])
    try:
        load_trainer(CheckpointManager(root), build_trainer(cfg, world, {}))
    except CheckpointError as e:
        return str(e)
    return "loaded"


def _lora(rank, world, root, degrees):
    from vfm_core.checkpoints.init import start_from_init

    tr = _trainer(world, degrees, 2, f"train.init={root}", "train.lora.rank=4")
    start_from_init(tr)
    log = fit_collect(tr)
    frozen = sum(1 for _, p in tr.layout.named_parameters() if not p.requires_grad)
    return {"losses": log.losses, "norms": log.column("grad_norm"), "frozen": frozen}


@pytest.fixture(scope="module")
def tp2_run(tmp_path_factory):
    """A run saved under TP2 at step 2 (a run directory: config.yaml beside checkpoints/) and
    the losses of its steps 3 and 4 had it never stopped."""
    root = tmp_path_factory.mktemp("tp2")
    expected = run_ranks(_save_then_continue, 2, str(root))[0]
    save_yaml(_cfg(2), root / "config.yaml")
    return root, expected


@pytest.mark.slow
def test_tp2_checkpoint_resumes_under_fsdp2_and_one_process(tp2_run):
    tmp_path, expected = tp2_run
    assert len(expected) == 2
    assert [p.name for p in (tmp_path / "checkpoints").iterdir()] == ["step_00000002"]
    assert not list((tmp_path / "checkpoints" / "step_00000002").glob("*.metadata"))  # no pickle
    fsdp2 = run_ranks(_resume, 2, str(tmp_path), dict(dp_shard=2))
    for degrees, results in (
        (dict(dp_shard=2), fsdp2),
        ({}, [one_process(_resume, str(tmp_path), {})]),
    ):
        for r in results:
            assert r["path"] == "step_00000002"
            for got, want in zip(r["losses"], expected, strict=True):
                assert abs(got - want) <= TOL * abs(want), (degrees, r["losses"], expected)
    msg = one_process(_resume_wrong_model, str(tmp_path))
    assert "another model shape (model.depth: checkpoint 2 vs now 3)" in msg


def _started(rank, world, root, layouts):
    """Per (degrees, check_init) of ``layouts``, in one process group: the full init's step
    (when asked) and the LoRA run."""
    return [
        {
            "init": _init_then_step(rank, world, root, degrees) if check_init else None,
            "lora": _lora(rank, world, root, degrees),
        }
        for degrees, check_init in layouts
    ]


LAYOUTS = [
    (dict(tp=2, dp_shard=1), False),
    (dict(dp_shard=2), True),
    (dict(pp=2, dp_shard=1), False),
]


@pytest.mark.slow
def test_runs_started_from_it_full_or_lora_train_alike_under_every_layout(tp2_run):
    """``train.init`` of the TP2 checkpoint: the weights under FSDP2 are the one-process ones
    and the first step's loss is the same; a LoRA run (adapters train, the rest frozen) takes
    the one-process losses and gradient norms under TP2, FSDP2 and PP2."""
    root = str(tp2_run[0])
    (one,) = one_process(_started, root, [({}, True)])
    init, ref = one["init"], one["lora"]
    assert ref["frozen"] > 0 and all(n > 0 for n in ref["norms"]), ref
    for (degrees, _), got in zip(LAYOUTS, run_ranks(_started, 2, root, LAYOUTS)[0], strict=True):
        if got["init"] is not None:
            assert got["init"]["step"] == init["step"] == 0 and got["init"]["sums"] == init["sums"]
            first, want = got["init"]["losses"][0], init["losses"][0]
            assert abs(first - want) <= TOL * abs(want), degrees
        for key in ("losses", "norms"):
            for g, w in zip(got["lora"][key], ref[key], strict=True):
                assert abs(g - w) <= TOL * abs(w), (degrees, key, got["lora"][key], ref[key])
