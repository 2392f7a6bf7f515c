"""Context parallelism for inference: each rank embeds, attends and transforms a contiguous slice
of the latent tokens; the DiT's output is all-gathered so the sampler state stays replicated.

Built from the parallel package's public pieces (:class:`vfm_core.parallel.context.
ContextParallelAttention`,
:func:`~vfm_core.parallel.context.seq_chunk`, :func:`~vfm_core.parallel.context.gather_seq`) and
:class:`~vfm_core.parallel.dims.ParallelDims` for the mesh, with the same hooks as
``parallelize_dit``'s sequence split, but without what training adds (gradient sync, FSDP
sharding of the weights over the CP ranks): sampling has no backward, and every rank keeping the
full weights saves one all-gather per block per step. Tokens stay in (t, h, w) raster order; rank
r owns tokens ``[r*N/P, (r+1)*N/P)``.
"""

from __future__ import annotations

from dataclasses import replace

import torch.distributed as dist
from torch import nn

from vfm_core.parallel.context import ContextParallelAttention, gather_seq, seq_chunk
from vfm_core.parallel.dims import ParallelDims

__all__ = ["context_parallel_for_sampling", "sampling_cp_group"]


def sampling_cp_group(device_type: str) -> tuple[dist.ProcessGroup, int, int]:
    """(group, rank, world): every rank of the default process group as one context-parallel
    group, the only layout sampling uses."""
    world = dist.get_world_size()
    dims = ParallelDims(cp=world, dp_shard=1, world_size=world)
    dims.build_mesh(device_type)
    return dims.group("cp"), dims.coord("cp"), world


def context_parallel_for_sampling(model: nn.Module, *, arch: str) -> int:
    """Split ``model``'s token sequence over all ranks of the default process group (in place);
    returns the CP degree (1 = nothing to do: single process)."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return 1
    group, rank, world = sampling_cp_group(next(model.parameters()).device.type)
    # full 3D attention: ring (exact online softmax); ST-DiT spatial/temporal: all-to-all
    mode = "hybrid" if arch == "stdit" else "ring"
    for block in model.blocks.values():
        for a in block.self_attn:
            a.core = ContextParallelAttention(group, mode, local=a.core)

    def split(_mod, _inp, out):  # (B, N, D) -> (B, N/P, D)
        return seq_chunk(out, rank, world)

    def rope_chunk(_mod, args):  # block(h, emb, shared, text, rope (N, d/2), *, spec)
        args = list(args)
        args[4] = seq_chunk(args[4], rank, world, dim=0)  # (N/P, d/2)
        return tuple(args)

    def gather(_mod, _inp, out):  # (B, N/P, C*P) -> (B, N, C*P)
        return gather_seq(out, group)

    def rows_chunk(_mod, args, kwargs):  # per-frame modulation rows (B, N) -> (B, N/P)
        pack = kwargs.get("pack")
        if pack is None:
            return None
        rows = seq_chunk(pack.token_sample, rank, world, dim=pack.token_sample.ndim - 1)
        return args, {**kwargs, "pack": replace(pack, token_sample=rows)}

    model.x_embedder.register_forward_hook(split)
    for block in model.blocks.values():
        block.register_forward_pre_hook(rope_chunk)
    for module in (*model.blocks.values(), model.final):  # a frame prompt's noise levels
        module.register_forward_pre_hook(rows_chunk, with_kwargs=True)
    model.final.register_forward_hook(gather)
    return world
