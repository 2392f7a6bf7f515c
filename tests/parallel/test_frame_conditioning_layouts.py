"""Video-to-world training (``diffusion.frame_cond``) under context and tensor parallelism: the
per-frame noise levels follow each rank's token chunk, so CP2 (ring) and TP2 with sequence
parallelism train the one-process losses and gradient norms (fp32, relative 1e-5)."""

from __future__ import annotations

import pytest
from parallel_harness import build_trainer, fit_collect, one_process, run_ranks

from vfm_core.config import apply_overrides
from vfm_core.recipes import get_recipe

TOL = 1e-5
TINY = [
    "model.hidden=64",
    "model.depth=2",
    "model.text_dim=32",
    "data.batch_size=4",
    "data.latent_frames=4",
    "data.latent_height=8",
    "data.latent_width=8",
    "diffusion.frame_cond=0.5",
    "diffusion.frame_cond_max=2",
    "optim.lr=0.01",
    "optim.warmup_steps=1",
    "train.steps=3",
    "train.device=cpu",
    "tracking.mlflow=false",
]
LAYOUTS = [dict(cp=2, dp_shard=1), dict(tp=2, dp_shard=1)]


def _runs(rank, world, layouts):
    cfg = apply_overrides(get_recipe("dit-tiny"), [*TINY, "parallel.cp_mode=ring"])
    out = []
    for degrees in layouts:
        log = fit_collect(build_trainer(cfg, world, degrees))
        out.append({"losses": log.losses, "norms": log.column("grad_norm")})
    return out


@pytest.mark.slow
def test_frame_conditioned_training_is_the_same_under_cp_and_tp_sp():
    (ref,) = one_process(_runs, [{}])  # one process: this one
    assert all(n > 0 for n in ref["norms"])
    for degrees, got in zip(LAYOUTS, run_ranks(_runs, 2, LAYOUTS)[0], strict=True):
        for key in ("losses", "norms"):
            for g, w in zip(got[key], ref[key], strict=True):
                assert abs(g - w) <= TOL * abs(w), (degrees, key, got[key], ref[key])
