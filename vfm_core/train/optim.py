"""AdamW, its learning-rate schedule, and its state under parameter names (layout independent).

One optimizer updates every parameter this rank holds (the whole model, or its pipeline stages;
shards under FSDP / TP). Its state is saved keyed by the one-process model's parameter names, in
the structure ``torch.distributed.checkpoint.state_dict.get_state_dict`` uses (``state`` per
name, ``param_groups`` with name lists), so a checkpoint of any layout restores into any other.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

import torch
from torch.distributed.tensor import DTensor

from vfm_core.config import OptimConfig


def lr_lambda(optim: OptimConfig, total_steps: int):
    """Linear warm-up to the peak, then constant or cosine to ``min_lr_ratio`` at the horizon."""
    horizon = optim.decay_steps or total_steps

    def fn(step: int) -> float:
        if step < optim.warmup_steps:
            return (step + 1) / optim.warmup_steps
        if optim.schedule == "constant":
            return 1.0
        progress = min(1.0, (step - optim.warmup_steps) / max(1, horizon - optim.warmup_steps))
        return optim.min_lr_ratio + (1 - optim.min_lr_ratio) * 0.5 * (
            1 + math.cos(math.pi * progress)
        )

    return fn


def build_optimizer(
    params: Iterable[torch.nn.Parameter], o: OptimConfig, total_steps: int
) -> tuple[torch.optim.AdamW, torch.optim.lr_scheduler.LambdaLR]:
    """AdamW over ``params`` and its warm-up / decay schedule. Plain tensors (one process, or
    replicated data parallelism) update in torch's fused kernel (``optim.fused`` true or 'auto';
    on CPU 5x faster than the ``foreach`` pass, measured at 14M parameters: 7 vs 39 ms), or with
    ``optim.fused=false`` in one ``foreach`` pass; DTensors (FSDP, TP: possibly on different
    meshes) one tensor at a time. Same math either way (equal to rounding; a resumed run uses the
    same kernel, so it stays bit-identical)."""
    params = list(params)
    plain = not any(isinstance(p, DTensor) for p in params)
    devices = {p.device.type for p in params}
    fused = o.fused in ("auto", True) and plain and devices <= {"cpu", "cuda"}
    how = {"fused": True} if fused else {"foreach": plain}
    opt = torch.optim.AdamW(
        params, lr=o.lr, betas=o.betas, eps=o.eps, weight_decay=o.weight_decay, **how
    )
    return opt, torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda(o, total_steps))


def optimizer_state(opt: torch.optim.Optimizer, names: Sequence[str]) -> dict[str, Any]:
    """``opt``'s state keyed by parameter name (``names[i]`` is its i-th parameter; a name that
    repeats, a conditioning replica of several local pipeline stages, keeps one entry: the
    replicas are updated alike)."""
    raw = opt.state_dict()
    groups = []
    for g in raw["param_groups"]:
        listed = list(dict.fromkeys(names[i] for i in g["params"]))
        groups.append({**{k: v for k, v in g.items() if k != "params"}, "params": listed})
    return {"state": {names[i]: s for i, s in raw["state"].items()}, "param_groups": groups}


def load_optimizer_state(
    opt: torch.optim.Optimizer, names: Sequence[str], state: dict[str, Any]
) -> list[str]:
    """Restore :func:`optimizer_state` (saved under any layout) into ``opt``: every parameter's
    moments by name. The hyper-parameters stay ``opt``'s, the run's ``optim`` settings (a resume
    with ``--set optim.lr=...`` trains with it); returns what differs from the saved ones, e.g.
    ``["optim.lr: 0.0003 in the checkpoint, 0.01 now"]`` (none: the resume is bit-identical)."""
    saved = state["state"]
    missing = [n for n in names if n not in saved]
    if missing:
        raise KeyError(f"optimizer state lacks {missing[0]} (and {len(missing) - 1} more)")
    hyper = {k: v for k, v in opt.param_groups[0].items() if k != "params"}
    was = state["param_groups"][0]
    changed = [
        f"optim.{key}: {_plain(was[k])} in the checkpoint, {_plain(hyper[k])} now"
        for k, key in _HYPER.items()
        if k in was and k in hyper and _plain(was[k]) != _plain(hyper[k])
    ]
    seen: set[str] = set()
    per_param = {}
    for i, n in enumerate(names):  # a replica's second copy gets tensors of its own
        per_param[i] = saved[n] if n not in seen else {k: v.clone() for k, v in saved[n].items()}
        seen.add(n)
    opt.load_state_dict(
        {"state": per_param, "param_groups": [{**hyper, "params": list(range(len(names)))}]}
    )
    return changed


_HYPER = {"initial_lr": "lr", "betas": "betas", "eps": "eps", "weight_decay": "weight_decay"}
"""Parameter-group keys that come from the ``optim`` settings (``initial_lr``: the peak the
schedule scales), compared on resume."""


def _plain(v: Any) -> Any:
    """A hyper-parameter as plain numbers (a tensor lr, betas as a list or a tuple)."""
    if isinstance(v, torch.Tensor):
        return v.item()
    return tuple(_plain(x) for x in v) if isinstance(v, list | tuple) else v


def restore_schedule(sched: torch.optim.lr_scheduler.LambdaLR, state: dict[str, Any]) -> None:
    """Load the schedule's position from ``state``; its peak (``base_lrs``) and shape stay the
    run's, and the current learning rate is recomputed from them as ``step()`` computes it (equal
    to the saved one when the settings did not change)."""
    sched.load_state_dict(state)
    sched.base_lrs = [g["initial_lr"] for g in sched.optimizer.param_groups]
    lrs = [base * fn(sched.last_epoch) for base, fn in zip(sched.base_lrs, sched.lr_lambdas)]
    for group, lr in zip(sched.optimizer.param_groups, lrs, strict=True):
        group["lr"] = lr
    sched._last_lr = lrs
