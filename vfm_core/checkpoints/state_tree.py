"""A Stateful state as JSON + tensors: the tree operations behind the checkpoint manager.

A state dict is a tree of dicts / lists with tensors and JSON leaves. :func:`split_state` cuts it
into a flat ``{dotted path: tensor}`` dict (what DCP writes to safetensors) and a JSON skeleton
(``{"__tensor__": path}`` where a tensor was); :func:`join_state` puts them back together. Ranks
of a parallel run may hold different tensors (pipeline stages): :func:`merge_skeletons` unites
their skeletons for the one ``state.json``, :func:`restrict_skeleton` cuts the part one rank
holds back out of it. Nothing here is ever pickled.
"""

from __future__ import annotations

from typing import Any

import torch

from vfm_core.checkpoints.errors import CheckpointError


def split_state(tree: Any, prefix: str = "") -> tuple[dict[str, torch.Tensor], Any]:
    """Nested state -> (flat dict of tensors by dotted path, JSON skeleton with the other leaves).

    Tensors in the skeleton are replaced by ``{"__tensor__": path}``.
    """
    tensors: dict[str, torch.Tensor] = {}

    def walk(node: Any, path: str) -> Any:
        if isinstance(node, torch.Tensor):
            tensors[path] = node
            return {"__tensor__": path}
        if isinstance(node, dict):
            return {str(k): walk(v, f"{path}.{k}" if path else str(k)) for k, v in node.items()}
        if isinstance(node, list | tuple):
            return [walk(v, f"{path}.{i}") for i, v in enumerate(node)]
        return node

    return tensors, walk(tree, prefix)


def join_state(skeleton: Any, tensors: dict[str, torch.Tensor]) -> Any:
    if isinstance(skeleton, dict):
        if set(skeleton) == {"__tensor__"}:
            return tensors[skeleton["__tensor__"]]
        return {k: join_state(v, tensors) for k, v in skeleton.items()}
    if isinstance(skeleton, list):
        return [join_state(v, tensors) for v in skeleton]
    return skeleton


def restore_int_keys(tree: Any, like: Any) -> Any:
    """JSON turns int dict keys (optimizer param ids) into strings; take key types from ``like``."""
    if isinstance(tree, dict) and isinstance(like, dict):
        by_str = {str(k): k for k in like}
        return {
            by_str.get(k, k): restore_int_keys(v, like.get(by_str.get(k, k)))
            for k, v in tree.items()
        }
    if isinstance(tree, list) and isinstance(like, list | tuple):
        return [restore_int_keys(v, like[i] if i < len(like) else None) for i, v in enumerate(tree)]
    return tree


def split_state_paths(skeleton: Any) -> list[str]:
    out: list[str] = []

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            if set(node) == {"__tensor__"}:
                out.append(node["__tensor__"])
            else:
                for v in node.values():
                    walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    walk(skeleton)
    return out


def _ordered_union(lists: list[list]) -> list:
    seen: dict = {}
    for items in lists:
        for x in items:
            seen.setdefault(x, None)
    return list(seen)


def merge_skeletons(skeletons: list[Any], path: str = "") -> Any:
    """One skeleton holding the state of all ranks: dicts are united key by key (the first rank
    holding a key gives its order), ``optim.param_groups`` keep rank 0's hyper-parameters with
    the parameter names of all ranks (``params``, first-seen order), any other leaf is the first
    rank's (step, LR schedule, data position: equal on every rank)."""
    first = skeletons[0]
    if isinstance(first, dict) and all(isinstance(s, dict) for s in skeletons):
        keys = _ordered_union([list(s) for s in skeletons])
        return {
            k: merge_skeletons([s[k] for s in skeletons if k in s], f"{path}.{k}" if path else k)
            for k in keys
        }
    if path == "optim.param_groups":
        if len({len(s) for s in skeletons}) != 1:
            raise CheckpointError(
                f"optimizer param_groups differ in number across ranks "
                f"({sorted({len(s) for s in skeletons})}); cannot merge them"
            )
        return [
            {**groups[0], "params": _ordered_union([g["params"] for g in groups])}
            for groups in zip(*skeletons)
        ]
    return first


_DROP = object()


def restrict_skeleton(node: Any, keep: set[str]) -> Any:
    """``node`` without the tensors outside ``keep`` (dicts that held only such tensors go too):
    the part of a merged skeleton this rank's state holds. Other leaves stay."""
    if isinstance(node, dict):
        if set(node) == {"__tensor__"}:
            return node if node["__tensor__"] in keep else _DROP
        out = {k: r for k, v in node.items() if (r := restrict_skeleton(v, keep)) is not _DROP}
        return _DROP if node and not out else out
    if isinstance(node, list):
        return [r for v in node if (r := restrict_skeleton(v, keep)) is not _DROP]
    return node
