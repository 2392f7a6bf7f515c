"""Low-rank adapters (LoRA, Hu et al. 2021) and frozen parameters: what a fine-tuning run trains.

:func:`add_adapters` turns the ``nn.Linear`` modules named by ``train.lora.targets`` into
:class:`LoRALinear` (same ``weight`` / ``bias`` names, plus ``lora_a`` (r, in) and ``lora_b``
(out, r)), on the ``meta`` model before it is cut into pipeline stages and parallelised, like the
FP8 conversion. :func:`freeze` then leaves ``requires_grad`` only on what trains
(``train.trainable``; with LoRA the adapters too). The layout applies TP, FSDP2 and pipelining
to the adapted model as to any other: parameters keep their names, frozen ones get no gradient
and the optimizer holds no state for them. Under tensor parallelism
:func:`vfm_core.parallel.parallelize` splits an adapter with its linear (column-parallel: B by
rows, A whole; row-parallel: A by columns, B whole), and :meth:`LoRALinear.forward` computes the
update on the local pieces, placed like the linear's own output.

:func:`merge_adapters` folds ``W + (alpha / r) B A`` back into plain linears (``vfm checkpoint
merge``, inference).
"""

from __future__ import annotations

import fnmatch
import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.tensor import DTensor, Partial, Shard

from vfm_core.config import ConfigError, LoraConfig
from vfm_core.models.init import Init, InitRule

ADAPTERS = ("lora_a", "lora_b")
"""The parameter names an adapter adds to its linear."""


def is_adapter(name: str) -> bool:
    """Whether parameter ``name`` belongs to a LoRA adapter."""
    return name.rsplit(".", 1)[-1] in ADAPTERS


class LoRALinear(nn.Linear):
    """``y = x W^T + b + scale * (x A^T) B^T``: an ``nn.Linear`` (its ``weight`` and ``bias``,
    the base) with the adapter ``lora_a`` (r, in) and ``lora_b`` (out, r)."""

    def __init__(self, base: nn.Linear, rank: int, scale: float):
        nn.Module.__init__(self)
        self.in_features, self.out_features = base.in_features, base.out_features
        self.register_parameter("weight", base.weight)  # (out, in)
        self.register_parameter("bias", base.bias)  # (out,) | None
        w = base.weight
        self.lora_a = nn.Parameter(torch.empty(rank, self.in_features, device=w.device))
        self.lora_b = nn.Parameter(torch.empty(self.out_features, rank, device=w.device))
        self.rank, self.scale = rank, scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (..., in) -> (..., out)
        y = F.linear(x, self.weight, self.bias)
        return y + self.update(x)

    def update(self, x: torch.Tensor) -> torch.Tensor:
        """``scale * (x A^T) B^T``. Under TP (``x`` a DTensor) computed on the local pieces:
        column-parallel (B split by rows, x whole) gives this rank's output columns, Shard(-1);
        row-parallel (A split by columns like W, x split likewise) a partial sum, Partial() —
        the layouts of the linear's own output, which TP's output hook then finishes."""
        if not isinstance(x, DTensor):
            return F.linear(F.linear(x, self.lora_a), self.lora_b) * self.scale
        colwise = not isinstance(self.lora_a, DTensor)  # row-parallel splits A with W
        local_x = x.to_local(grad_placements=[Partial()] if colwise else None)
        a, b = (p.to_local() if isinstance(p, DTensor) else p for p in (self.lora_a, self.lora_b))
        out = F.linear(F.linear(local_x, a), b) * self.scale  # (..., out/tp) | partial (..., out)
        return DTensor.from_local(
            out, x.device_mesh, [Shard(-1) if colwise else Partial()], run_check=False
        )

    def merged(self) -> nn.Linear:
        """A plain linear computing the same function (``W + scale B A``)."""
        out = nn.Linear(self.in_features, self.out_features, bias=self.bias is not None)
        with torch.no_grad():
            out.weight.copy_(self.weight + self.scale * self.lora_b @ self.lora_a)
            if self.bias is not None:
                out.bias.copy_(self.bias)
        return out


def add_adapters(model: nn.Module, lora: LoraConfig) -> list[str]:
    """Replace the linears ``lora.targets`` name by :class:`LoRALinear` of ``lora.rank`` (in
    place, any device, ``meta`` included) and extend the model's ``init_rule``: A normal with
    std 1/sqrt(in), B zero. Returns the adapted module names. A pattern matching no linear, or
    a rank above a linear's smaller side, is a ConfigError naming it."""
    if lora.rank <= 0:
        return []
    linears = [n for n, m in model.named_modules() if type(m) is nn.Linear]
    chosen: list[str] = []
    for pattern in lora.targets:
        hits = [n for n in linears if fnmatch.fnmatchcase(n, pattern)]
        if not hits:
            shown = ", ".join(linears[:6]) + (", ..." if len(linears) > 6 else "")
            raise ConfigError(
                f"train.lora.targets: {pattern!r} matches no linear of the model (its linears: "
                f"{shown})"
            )
        chosen += [n for n in hits if n not in chosen]
    for name in chosen:
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name)
        old = getattr(parent, child)
        if lora.rank > min(old.in_features, old.out_features):
            raise ConfigError(
                f"train.lora.rank: {lora.rank} is above the width of {name} "
                f"({old.in_features} -> {old.out_features})"
            )
        setattr(parent, child, LoRALinear(old, lora.rank, lora.scale))
    model.init_rule = _with_adapter_init(model.init_rule)
    return chosen


def _with_adapter_init(rule: InitRule) -> InitRule:
    def adapted(name: str, shape: tuple[int, ...]) -> Init:
        if name.endswith(".lora_a"):
            return Init(kind="normal", std=1.0 / math.sqrt(shape[1]))
        if name.endswith(".lora_b"):
            return Init(kind="zeros")
        return rule(name, shape)

    return adapted


def trainable_names(model: nn.Module, patterns: tuple[str, ...], *, lora: bool) -> list[str]:
    """The parameter names that train: those ``patterns`` match (each must match one), plus
    the adapters with ``lora``; every parameter when neither is given."""
    names = [n for n, _ in model.named_parameters()]
    if not patterns and not lora:
        return names
    chosen = {n for n in names if lora and is_adapter(n)}
    for pattern in patterns:
        hits = {n for n in names if fnmatch.fnmatchcase(n, pattern)}
        if not hits:
            shown = ", ".join(names[:6]) + (", ..." if len(names) > 6 else "")
            raise ConfigError(
                f"train.trainable: {pattern!r} matches no parameter of the model (its "
                f"parameters: {shown})"
            )
        chosen |= hits
    return [n for n in names if n in chosen]


def freeze(model: nn.Module, patterns: tuple[str, ...], *, lora: bool) -> int:
    """``requires_grad`` only on :func:`trainable_names`; returns how many parameters train."""
    keep = set(trainable_names(model, patterns, lora=lora))
    for name, p in model.named_parameters():
        p.requires_grad_(name in keep)
    return len(keep)


def merge_adapters(model: nn.Module) -> int:
    """Fold every :class:`LoRALinear` of ``model`` (plain tensors) into a plain ``nn.Linear`` in
    place; returns how many."""
    found = [(n, m) for n, m in model.named_modules() if isinstance(m, LoRALinear)]
    for name, module in found:
        parent_name, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent_name), child, module.merged().to(module.weight.device))
    return len(found)
