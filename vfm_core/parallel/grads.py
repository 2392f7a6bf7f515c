"""Gradient clipping over a parallelized model: one global norm whatever the layout."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor, Shard

from vfm_core.models.layers import has_values


@torch.no_grad()
def clip_grad_norm(
    model: nn.Module | Sequence[nn.Module],
    max_norm: float,
    *,
    holders: Callable[[str], float] | None = None,
) -> torch.Tensor:
    """Global L2 norm of all gradients of a parallelized model (or of this rank's pipeline
    stages, a list), then scale them to ``max_norm``.

    Gradients may be plain (replicated on every rank) or DTensors on different meshes (FSDP, TP,
    both). Each rank sums the squares of its local pieces weighted by 1 / (number of ranks holding
    that same piece) and one all-reduce over the world adds them up, so every element counts once.
    A piece is held by ``world / shards`` ranks, divided further by ``holders(name)`` where the
    model is itself one of several disjoint parts (pipeline stages: ``pp`` for a stage's own
    parameters; for conditioning replicas present on every stage, 1 / their copies on this rank).
    """
    world = dist.get_world_size()
    total = torch.zeros((), dtype=torch.float64)
    grads: list[torch.Tensor] = []  # the local pieces
    by_weight: dict[float, list[torch.Tensor]] = {}
    modules = [model] if isinstance(model, nn.Module) else list(model)
    named = [item for m in modules for item in m.named_parameters()]
    for name, p in named:
        g = p.grad
        if g is None:
            continue
        shards = 1
        if isinstance(g, DTensor):
            for i, pl in enumerate(g.placements):
                if isinstance(pl, Shard):
                    shards *= g.device_mesh.size(i)
            g = g.to_local()
        parts = holders(name) if holders is not None else 1
        grads.append(g)
        by_weight.setdefault(shards * parts / world, []).append(g)
    for weight, pieces in by_weight.items():  # one fused norm kernel per group, not per tensor
        norms = torch._foreach_norm(pieces, 2, dtype=torch.float32)  # [()] per piece
        total += torch.stack(norms).double().square().sum().cpu() * weight
    device = grads[0].device if grads else torch.device("cpu")
    total = total.to(device)
    dist.all_reduce(total)
    norm = total.sqrt()
    coef = (max_norm / (norm + 1e-6)).clamp(max=1.0)
    if grads and (not has_values(norm) or torch.isfinite(norm)):  # traced: scale, as if finite
        by_kind: dict[tuple, list[torch.Tensor]] = {}
        for g in grads:
            by_kind.setdefault((g.device, g.dtype), []).append(g)
        for (dev, dtype), pieces in by_kind.items():
            torch._foreach_mul_(pieces, coef.to(dev, dtype))
    return norm.float()
