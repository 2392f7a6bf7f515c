"""Weight initialisation as a function of (seed, parameter name) alone, on any layout.

A model says *how* each parameter starts (:class:`Init`: zeros, ones, normal, Xavier-uniform;
its ``init_rule(name, shape)``); :func:`init_parameters` draws the numbers. Every parameter's
values come from counter-based generators keyed by (seed, its fully qualified name, a block of
:data:`ROWS` rows), never from one sequential stream, so:

* a model built on the ``meta`` device, parallelised (TP / FSDP2 / pipeline stages: parameters
  become DTensor shards or stay on one stage), then materialised with ``to_empty`` gets, on every
  rank, exactly the slice of the one-process initialisation its shard covers (torchtitan's order:
  meta build -> parallelise -> ``to_empty`` -> initialise);
* a rank draws only the row blocks its shard touches (about 1/dp_shard of the model under FSDP),
  and the largest transient buffer is one parameter's rows, never the whole model;
* pipeline stages keep the single-device names, so a stage's blocks and every stage's replica of
  the conditioning modules start as in the one-process model.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import torch
from torch import nn
from torch.distributed.tensor import DTensor

ROWS = 256
"""Rows per counter-keyed block of a parameter (its first dimension; 1-D parameters: elements)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Init:
    """How one parameter starts."""

    kind: Literal["zeros", "ones", "normal", "xavier"]
    """zeros / ones; normal(0, std); xavier: uniform(+-sqrt(6 / (fan_in + fan_out))) of a
    (fan_out, fan_in) weight (Glorot & Bengio 2010)."""
    std: float = 0.0
    """Standard deviation of ``normal``."""


InitRule = Callable[[str, tuple[int, ...]], Init]
"""(fully qualified parameter name, full shape) -> :class:`Init`."""


def _generator(seed: int, name: str, block: int) -> torch.Generator:
    digest = hashlib.blake2b(f"init:{seed}:{name}:{block}".encode(), digest_size=8).digest()
    return torch.Generator().manual_seed(int.from_bytes(digest, "little") >> 1)


def full_rows(
    init: Init, shape: tuple[int, ...], rows: range, *, seed: int, name: str
) -> torch.Tensor:
    """Rows ``rows`` of parameter ``name``'s initial value (full ``shape``), float32, (len(rows),
    *shape[1:]); the same numbers whatever other rows are drawn alongside."""
    tail = shape[1:]
    out = torch.empty(len(rows), *tail)
    if init.kind in ("zeros", "ones"):
        return out.fill_(0.0 if init.kind == "zeros" else 1.0)
    if init.kind == "xavier":
        if len(shape) != 2:
            raise ValueError(f"{name}: Xavier init needs a 2-D weight, got shape {shape}")
        bound = math.sqrt(6.0 / (shape[0] + shape[1]))
    first, last = rows.start // ROWS, (rows.stop - 1) // ROWS if len(rows) else -1
    for block in range(first, last + 1):
        lo, hi = block * ROWS, min((block + 1) * ROWS, shape[0])
        values = torch.empty(hi - lo, *tail)
        g = _generator(seed, name, block)
        if init.kind == "normal":
            values.normal_(0.0, init.std, generator=g)
        else:
            values.uniform_(-bound, bound, generator=g)
        a, b = max(lo, rows.start), min(hi, rows.stop)
        out[a - rows.start : b - rows.start] = values[a - lo : b - lo]
    return out


def _local_box(p: torch.Tensor) -> tuple[torch.Tensor, tuple[int, ...], tuple[int, ...]]:
    """(local tensor, its shape, its offset in the full parameter) of a plain or DTensor
    parameter."""
    if not isinstance(p, DTensor):
        return p.data, tuple(p.shape), (0,) * p.ndim
    from torch._subclasses.fake_tensor import unset_fake_temporarily  # noqa: PLC2701
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset  # noqa: PLC2701

    with unset_fake_temporarily():  # integers, also under ``vfm plan --check``'s fake tensors
        shape, offset = compute_local_shape_and_global_offset(p.shape, p.device_mesh, p.placements)
    return p.to_local(), tuple(shape), tuple(offset)


@torch.no_grad()
def init_parameters(module: nn.Module, rule: InitRule, *, seed: int) -> None:
    """Fill every parameter of ``module`` (plain, or a DTensor shard on any mesh) with its part
    of the seed's initialisation (module docstring). Names are ``module``'s own, which for the
    models, their pipeline stages and their FSDP / TP / checkpoint wrappers are the one-process
    model's."""
    for name, p in module.named_parameters():
        full = tuple(p.shape)
        local, shape, offset = _local_box(p)
        if local.numel() == 0:
            continue
        rows = range(offset[0], offset[0] + shape[0]) if full else range(0, 1)
        values = full_rows(rule(name, full), full or (1,), rows, seed=seed, name=name)
        box = tuple(slice(o, o + s) for o, s in zip(offset[1:], shape[1:]))
        values = values[(slice(None), *box)].reshape(local.shape)
        local.copy_(values.to(local.dtype))


def linear_rule(zero: Callable[[str], bool], normal: Callable[[str], float | None]) -> InitRule:
    """The rule of a transformer: 2-D weights Xavier-uniform (or ``normal(name)`` std when not
    None), biases zero, norm weights one (1-D ``*norm*.weight``), and ``zero(name)`` parameters
    zero (AdaLN-Zero, output layers)."""

    def rule(name: str, shape: tuple[int, ...]) -> Init:
        if zero(name) or name.endswith(".bias"):
            return Init(kind="zeros")
        if len(shape) == 1:  # RMSNorm / LayerNorm scale
            return Init(kind="ones")
        std = normal(name)
        return Init(kind="xavier") if std is None else Init(kind="normal", std=std)

    return rule
