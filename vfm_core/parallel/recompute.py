"""Activation checkpointing of DiT blocks: ``full`` or ``selective`` (the planner's ``recompute``).

* ``full``: each block keeps only its input; the whole block runs again in the backward.
* ``selective`` (torchtitan ``apply_ac`` op-level policy; Korthikanti et al. 2022 §5): each block
  keeps its input and the outputs of its **matmuls** (q/k/v/o projections, cross-attention, MLP
  linears, AdaLN modulation) and of the **attention kernel** (output + log-sum-exp), and recomputes
  the cheap, memory-heavy element-wise work in the backward: norms, AdaLN modulate, RoPE, QK-norm,
  GELU/SiLU, head reshapes and copies. This is exactly what
  :func:`vfm_core.perf.memory.block_saved_elements` counts for ``recompute="selective"``;
  ``tests/perf/test_recompute.py`` measures the storages a real block keeps alive against it.

Collectives inside a block (TP/SP, ring / all-to-all CP) are re-run by the recompute, the same on
every rank. Applied by :func:`vfm_core.parallel.parallelize.parallelize_dit` and
:func:`vfm_core.parallel.pipeline.parallelize_stage` after TP/CP and before FSDP2; parameter names
do not change.
"""

from __future__ import annotations

import functools
from typing import Literal

import torch
from torch import nn
from torch.utils.checkpoint import (
    CheckpointPolicy,
    checkpoint,
    create_selective_checkpoint_contexts,
)

Recompute = Literal["none", "full", "selective"]
RECOMPUTE = ("none", "full", "selective")

_aten = torch.ops.aten
SAVE_OPS: frozenset = frozenset(
    op
    for op in (
        _aten.mm.default,
        _aten.addmm.default,
        _aten.bmm.default,
        _aten._scaled_dot_product_flash_attention.default,
        _aten._scaled_dot_product_flash_attention_for_cpu.default,
        _aten._scaled_dot_product_efficient_attention.default,
        _aten._scaled_dot_product_cudnn_attention.default,
    )
)
"""Ops whose outputs selective checkpointing keeps (matmuls and fused attention)."""


def _policy(ctx, op, *args, **kwargs) -> CheckpointPolicy:
    return CheckpointPolicy.MUST_SAVE if op in SAVE_OPS else CheckpointPolicy.PREFER_RECOMPUTE


def _selective_context():
    return create_selective_checkpoint_contexts(_policy)


def normalize(mode: bool | str | None) -> Recompute:
    """``False``/None/"none" -> "none", ``True``/"full" -> "full", "selective" -> "selective"."""
    if mode is None or mode is False:
        return "none"
    if mode is True:
        return "full"
    if mode not in RECOMPUTE:
        raise ValueError(f"activation checkpointing {mode!r} (choose from {', '.join(RECOMPUTE)})")
    return mode  # type: ignore[return-value]


def uses_selective(mode: bool | str | None, full_blocks: int = 0) -> bool:
    """Whether :func:`checkpoint_blocks` runs any block under the selective policy."""
    mode = normalize(mode)
    return mode == "selective" or (mode == "full" and full_blocks > 0)


def checkpoint_blocks(
    blocks: nn.ModuleDict | dict, mode: bool | str | None, *, full_blocks: int = 0
) -> None:
    """Wrap each block's forward in ``mode`` checkpointing, in place (no-op for "none").
    ``full_blocks`` > 0 with mode ``full``: only the first that many blocks are recomputed
    whole, the rest selectively (``parallel.activation_checkpointing_blocks``)."""
    mode = normalize(mode)
    if mode == "none":
        return
    for i, block in enumerate(blocks.values()):
        own = "selective" if mode == "full" and 0 < full_blocks <= i else mode
        kw = {"use_reentrant": False}
        if own == "selective":
            kw["context_fn"] = _selective_context
        block.forward = functools.partial(checkpoint, block.forward, **kw)


def live_saved_bytes(fn, exclude) -> int:
    """Bytes of the storages created while ``fn()`` runs that are still alive after it returned,
    minus its output and ``exclude`` (parameters, inputs): what the autograd graph (saved tensors,
    checkpoint caches) keeps for the backward. Works for every recompute mode, unlike counting
    ``saved_tensors_hooks`` (checkpointing installs its own)."""
    from torch.multiprocessing.reductions import StorageWeakRef
    from torch.utils._python_dispatch import TorchDispatchMode  # noqa: PLC2701
    from torch.utils._pytree import tree_leaves  # noqa: PLC2701

    seen: list[tuple[int, StorageWeakRef, int]] = []  # addresses are reused: keep every one

    class _Track(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for t in tree_leaves(out):
                if isinstance(t, torch.Tensor) and not t.is_meta:
                    st = t.untyped_storage()
                    seen.append((st.data_ptr(), StorageWeakRef(st), st.nbytes()))
            return out

    with _Track():
        out = fn()
    skip = {t.untyped_storage().data_ptr() for t in exclude}
    skip |= {t.untyped_storage().data_ptr() for t in tree_leaves(out) if torch.is_tensor(t)}
    alive = {ptr: n for ptr, ref, n in seen if ptr not in skip and not ref.expired()}
    del out
    return sum(alive.values())
