"""One training step on *packed* sequences under a parallel layout vs. one process, same packs.

Two packs of 48 tokens hold samples of different latent grids (one pack padded by 8 tokens), each
sample with its own sigma and caption length. The global loss is the mean over packs of the pack's
packed EDM loss (mean over its samples). Data parallelism splits the packs over the dp ranks; CP /
SP cut every pack into contiguous chunks of 48 / (cp * tp) tokens, which cut samples apart (that is
the point: ring / all-to-all attention must join them through the whole pack's group ids).
:func:`packed_steps_worker` runs on every gloo rank and returns, per case, the relative errors of
the loss and of every gathered gradient (same format as ``equivalence.step_worker``).
"""

from __future__ import annotations

import dataclasses

import torch
from equivalence import data_parallel_report, run_cases, seeded_pair, tiny_model_cfg

from vfm_core.config import DiffusionConfig
from vfm_core.diffusion.objective import create_diffusion
from vfm_core.diffusion.packed import packed_loss
from vfm_core.families import build_model
from vfm_core.geometry import pack_latents
from vfm_core.parallel.dims import ParallelDims
from vfm_core.parallel.parallelize import parallelize_dit, sync_grads

PACK_LENGTH = 48
# latents (C, T, H, W), patch (1, 2, 2): pack 0 grids (2,3,2) (1,4,4) (3,2,2) = 40 tokens + 8
# padding; pack 1 grids (2,4,4) (2,2,2) (1,2,4) = 48 tokens exactly
PACKS = [
    [(4, 2, 6, 4), (4, 1, 8, 8), (4, 3, 4, 4)],
    [(4, 2, 8, 8), (4, 2, 4, 4), (4, 1, 4, 8)],
]
TEXT_LENGTHS = [[4, 1, 3], [2, 4, 3]]


def packed_model_cfg(arch: str):
    """The tiny configs of ``equivalence``; ``stdit_mixed``: ST-DiT whose second block is full
    attention, so the hybrid runs all-to-all (spatial / temporal) and ring (full) in one model."""
    if arch == "stdit_mixed":
        return dataclasses.replace(tiny_model_cfg("stdit"), stdit_full_every=2)
    return tiny_model_cfg(arch)


def make_packs(patch) -> list[dict]:
    g = torch.Generator().manual_seed(7)
    packs = []
    for shapes, lengths in zip(PACKS, TEXT_LENGTHS):
        x0 = [torch.randn(s, generator=g, dtype=torch.float64) * 0.5 for s in shapes]
        noise = [torch.randn(s, generator=g, dtype=torch.float64) for s in shapes]
        tokens, layout = pack_latents(x0, patch, PACK_LENGTH)  # (48, C*P)
        noise_tok, _ = pack_latents(noise, patch, PACK_LENGTH)
        packs.append(
            {
                "x0": tokens,
                "noise": noise_tok,
                "layout": layout,
                "text": torch.randn(len(shapes), 4, 32, generator=g, dtype=torch.float64),
                "lengths": torch.tensor(lengths),
                "sigma": torch.exp(torch.randn(len(shapes), generator=g, dtype=torch.float64) - 1),
            }
        )
    return packs


def pack_loss(model, edm, pack: dict) -> torch.Tensor:
    """Packed EDM loss of one pack, mean over its samples."""
    layout, lengths = pack["layout"], pack["lengths"]

    def net(x, c_noise, text):
        return model.forward_packed(x, c_noise, text, lengths, layout)  # (N, C*P)

    return packed_loss(
        edm,
        net,
        pack["x0"],
        pack["text"],
        sigma=pack["sigma"],
        noise=pack["noise"],
        sample_ids=layout.sample_ids,
    ).mean()


def packed_step_worker(rank: int, world: int, arch: str, degrees: dict, options: dict) -> dict:
    cfg = packed_model_cfg(arch)
    edm = create_diffusion(DiffusionConfig())
    ref, model = seeded_pair(cfg)
    packs = make_packs(cfg.patch)

    ref_loss = torch.stack([pack_loss(ref, edm, p) for p in packs]).mean()
    ref_loss.backward()

    dims = ParallelDims(**degrees, world_size=world)
    model = parallelize_dit(model, parallel_dims=dims, **options)
    per = len(packs) // dims.dp
    mine = packs[dims.dp_rank() * per : (dims.dp_rank() + 1) * per]
    loss = torch.stack([pack_loss(model, edm, p) for p in mine]).mean()
    loss.backward()
    sync_grads(model)
    r = data_parallel_report(loss, ref_loss, model, ref, world)
    return {k: r[k] for k in ("loss_err", "grad_err", "worst", "checked", "nonfinite")}


def uneven_pack_error(world: int) -> str:
    """The error a pack of 45 tokens gives under cp=``world`` (45 is not a multiple of it)."""
    cfg = packed_model_cfg("dit")
    torch.manual_seed(0)
    model = build_model(cfg).double()
    dims = ParallelDims(cp=world, dp_shard=1, world_size=world)
    model = parallelize_dit(model, parallel_dims=dims, cp_mode="ring")
    tokens, layout = pack_latents([torch.zeros(4, 1, 6, 6), torch.zeros(4, 4, 6, 6)], cfg.patch)
    text = torch.zeros(2, 4, 32, dtype=torch.float64)
    try:
        model.forward_packed(tokens.double(), torch.zeros(2), text, torch.tensor([4, 4]), layout)
    except ValueError as e:
        return f"{type(e).__name__}: {e}"
    return "no error"


def packed_steps_worker(rank: int, world: int, cases: list) -> dict:
    """:func:`packed_step_worker` for several cases in one spawn; a failing case reports its
    error instead of ending the spawn. Also the error of a pack not divisible by cp=world."""
    out = run_cases(lambda *case: packed_step_worker(rank, world, *case), cases)
    return {"cases": out, "uneven": uneven_pack_error(world)}
