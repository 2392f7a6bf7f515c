"""Sequence packing of variable-length samples (images and videos of several sizes).

Samples become token sequences of length ``t*h*w`` (their latent grid after patchify). Packing
puts several of them into one sequence of at most ``max_tokens`` (buffered first-fit-decreasing,
see :func:`first_fit_decreasing` and the planner in :mod:`vfm_core.data.plan`). A pack carries
everything the model needs to keep its samples apart:

* ``cu_seqlens`` (S+1,) — cumulative sample lengths (THD / varlen layout, flash-attn style);
* ``sample_ids`` (N,) — sample of every token (-1 for padding);
* ``positions`` (N, 3) — (t, h, w) of every token inside *its own* sample, for 3D RoPE;
* per-sample sigma / timestep expanded per token (:func:`expand_per_sample`), so each sample
  has its own noise level, not one per pack;
* per-sample text embeddings with their own lengths (:func:`pack_text`).

Attention: on CPU a boolean block-diagonal mask through SDPA (:func:`block_diagonal_mask`; flex
attention has no CPU backward); on GPU the same ``cu_seqlens`` feed varlen / flex / TE THD
kernels. Context parallelism: :func:`cp_chunks` cuts a pack into equal contiguous chunks; ring
attention visits each key chunk with its block of the same mask, merging partial results with
:func:`attention_lse` / :func:`merge_lse` (rows that see no key in a block add nothing). Loss:
per-token losses are averaged per sample first (:func:`per_sample_mean`), then over
samples, so a long video does not outweigh an image by its token count.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from vfm_core.models.layers import Grid, rope_dims


def first_fit_decreasing(lengths: Sequence[int], capacity: int) -> list[list[int]]:
    """Bins of item indices, each with total length <= capacity (FFD; ties by index, so the
    result is a pure function of the input). Items longer than ``capacity`` raise ValueError."""
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    bins: list[list[int]] = []
    free: list[int] = []
    for i in order:
        n = lengths[i]
        if n > capacity:
            raise ValueError(f"item {i} has {n} tokens > capacity {capacity}")
        for b, f in enumerate(free):
            if n <= f:
                bins[b].append(i)
                free[b] -= n
                break
        else:
            bins.append([i])
            free.append(capacity - n)
    return bins


def grid_tokens(grid: Grid) -> int:
    return grid[0] * grid[1] * grid[2]


@dataclass(kw_only=True, slots=True)
class PackLayout:
    """Token layout of one pack of S samples (N = sum of their tokens, padded to ``length``)."""

    grids: list[Grid]
    """Latent token grid (t, h, w) of every sample, in pack order."""
    cu_seqlens: torch.Tensor
    """(S+1,) int32 cumulative token counts."""
    sample_ids: torch.Tensor
    """(length,) int64 sample of every token, -1 for padding."""
    positions: torch.Tensor
    """(length, 3) int64 (t, h, w) of every token within its sample (0 for padding)."""
    length: int
    """Padded length (max_tokens, or N when unpadded)."""

    @classmethod
    def from_grids(cls, grids: Sequence[Grid], length: int | None = None) -> PackLayout:
        sizes = [grid_tokens(g) for g in grids]
        n = sum(sizes)
        length = n if length is None else length
        if n > length:
            raise ValueError(f"pack of {n} tokens does not fit length {length}")
        cu = torch.zeros(len(sizes) + 1, dtype=torch.int32)
        cu[1:] = torch.cumsum(torch.tensor(sizes, dtype=torch.int32), 0)
        ids = torch.full((length,), -1, dtype=torch.int64)
        pos = torch.zeros(length, 3, dtype=torch.int64)
        for s, (g, a) in enumerate(zip(grids, cu[:-1].tolist())):
            ids[a : a + sizes[s]] = s
            t, h, w = torch.meshgrid(*(torch.arange(x) for x in g), indexing="ij")
            pos[a : a + sizes[s]] = torch.stack([t, h, w], -1).reshape(-1, 3)  # (n_s, 3) raster
        return cls(grids=list(grids), cu_seqlens=cu, sample_ids=ids, positions=pos, length=length)

    @property
    def n_samples(self) -> int:
        return len(self.grids)

    @property
    def n_tokens(self) -> int:
        return int(self.cu_seqlens[-1])

    def padding_fraction(self) -> float:
        return 1.0 - self.n_tokens / self.length


def pack_tokens(tokens: Sequence[torch.Tensor], layout: PackLayout) -> torch.Tensor:
    """Per-sample tokens [(n_s, D)] -> one padded sequence (length, D) (zeros as padding)."""
    flat = torch.cat(list(tokens), 0)  # (N, D)
    out = flat.new_zeros(layout.length, flat.shape[-1])
    out[: flat.shape[0]] = flat
    return out  # (length, D)


def unpack_tokens(packed: torch.Tensor, layout: PackLayout) -> list[torch.Tensor]:
    """Inverse of :func:`pack_tokens`: (length, D) -> [(n_s, D)]."""
    cu = layout.cu_seqlens.tolist()
    return [packed[a:b] for a, b in zip(cu[:-1], cu[1:])]


def block_diagonal_mask(sample_ids: torch.Tensor) -> torch.Tensor:
    """(N,) sample ids -> (N, N) bool, True where query and key belong to the same sample.
    Padding tokens (-1) attend only to themselves, so no softmax row is empty (no NaN)."""
    same = sample_ids[:, None] == sample_ids[None, :]  # (N, N)
    pad = sample_ids < 0
    eye = torch.eye(len(sample_ids), dtype=torch.bool, device=sample_ids.device)
    return torch.where(pad[:, None] | pad[None, :], eye, same)


def rope_angles(positions: torch.Tensor, head_dim: int, theta: float) -> torch.Tensor:
    """(N, 3) per-token (t, h, w) -> (N, head_dim // 2) rotation angles; equal, sample by
    sample, to :func:`vfm_core.models.layers.rope_3d` of that sample's grid."""
    parts = []
    for axis, d in enumerate(rope_dims(head_dim)):
        if d == 0:
            continue
        freqs = theta ** (-torch.arange(0, d, 2, dtype=torch.float32) / d)  # (d/2,)
        parts.append(positions[:, axis, None].float() * freqs[None])  # (N, d/2)
    return torch.cat(parts, -1)  # (N, hd/2)


def expand_per_sample(
    values: torch.Tensor, sample_ids: torch.Tensor, fill: float = 0.0
) -> torch.Tensor:
    """Per-sample values (S, ...) -> per-token (N, ...), ``fill`` on padding."""
    out = values[sample_ids.clamp(min=0)]  # (N, ...)
    pad = (sample_ids < 0).view(-1, *([1] * (values.ndim - 1)))
    return out.masked_fill(pad, fill)


def per_sample_mean(
    token_loss: torch.Tensor, sample_ids: torch.Tensor, n_samples: int
) -> torch.Tensor:
    """Per-token losses (N,) -> mean over each sample's tokens (S,); padding ignored."""
    valid = sample_ids >= 0
    ids = sample_ids[valid]
    sums = torch.zeros(n_samples, dtype=token_loss.dtype, device=token_loss.device)
    sums = sums.index_add(0, ids, token_loss[valid])
    counts = torch.bincount(ids, minlength=n_samples).to(token_loss.dtype)
    return sums / counts  # (S,)


def pack_text(embeddings: Sequence[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-sample text embeddings [(L_s, D)] -> (S, L_max, D) zero-padded and lengths (S,)."""
    lengths = torch.tensor([e.shape[0] for e in embeddings], dtype=torch.int64)
    lmax, dim = int(lengths.max()), embeddings[0].shape[-1]
    out = embeddings[0].new_zeros(len(embeddings), lmax, dim)
    for s, e in enumerate(embeddings):
        out[s, : e.shape[0]] = e
    return out, lengths  # (S, L_max, D), (S,)


def cross_attention_mask(sample_ids: torch.Tensor, text_lengths: torch.Tensor) -> torch.Tensor:
    """(N,) token sample ids and (S,) text lengths -> (N, S*L_max) bool: a token attends to its
    own sample's text tokens only (padding tokens to the first text token, to stay finite)."""
    s, lmax = len(text_lengths), int(text_lengths.max())
    owner = torch.arange(s).repeat_interleave(lmax)  # (S*L,)
    within = (torch.arange(lmax)[None] < text_lengths[:, None]).reshape(-1)  # (S*L,)
    mask = (sample_ids[:, None] == owner[None]) & within[None]  # (N, S*L)
    pad = sample_ids < 0
    mask[pad, 0] = True
    return mask


# ----------------------------------------------------------------------------------------- CP
def cp_chunks(layout: PackLayout, cp: int) -> list[slice]:
    """Contiguous token ranges of a pack for ``cp`` context-parallel ranks (attention inside a
    pack is bidirectional and block-diagonal, so equal contiguous chunks balance the tokens).
    The mask block of ranks (i, j) is ``block_diagonal_mask(ids)[chunks[i], chunks[j]]``; a block
    may be empty for some rows, which :func:`attention_lse` handles."""
    if cp < 1 or layout.length % cp:
        raise ValueError(
            f"pack length {layout.length} is not divisible by cp={cp}: pack with "
            f"max_tokens a multiple of cp"
        )
    n = layout.length // cp
    return [slice(r * n, (r + 1) * n) for r in range(cp)]


def attention_lse(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Masked attention of one (query block, key block) pair with its log-sum-exp, for ring
    attention over packed sequences: q (B, H, Sq, d), k/v (B, H, Sk, d), mask (Sq, Sk) bool.
    Rows without any allowed key give output 0 and lse -inf (they add nothing when merged)."""
    scores = (q @ k.transpose(-2, -1)) * q.shape[-1] ** -0.5  # (B, H, Sq, Sk)
    scores = scores.masked_fill(~mask, float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)  # (B, H, Sq)
    p = torch.exp(scores - lse.nan_to_num(neginf=0.0)[..., None]).nan_to_num(nan=0.0)
    return p @ v, lse  # (B, H, Sq, d), (B, H, Sq)


def merge_lse(
    out_a: torch.Tensor, lse_a: torch.Tensor, out_b: torch.Tensor, lse_b: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Combine two partial attentions over disjoint key sets (online softmax)."""
    lse = torch.logaddexp(lse_a, lse_b)  # (B, H, Sq)
    safe = lse.nan_to_num(neginf=0.0)
    wa = torch.exp(lse_a - safe).nan_to_num(nan=0.0)[..., None]
    wb = torch.exp(lse_b - safe).nan_to_num(nan=0.0)[..., None]
    return wa * out_a + wb * out_b, lse  # (B, H, Sq, d), (B, H, Sq)


# ----------------------------------------------------------------------------------------- groups
ATTENTION_GROUPS = ("full", "spatial", "temporal")


def attention_groups(layout: PackLayout, kind: str) -> torch.Tensor:
    """(length,) int64 attention group of every token of the pack: two tokens attend to each
    other iff their ids are equal (mask ``ids[:, None] == ids[None, :]``).

    ``full``: the sample; ``spatial`` (ST-DiT, within a frame): (sample, t); ``temporal`` (across
    frames): (sample, h, w). Padding tokens get unique negative ids, so each attends to itself
    only (no empty softmax row, no NaN) and nothing else sees them."""
    if kind not in ATTENTION_GROUPS:
        raise ValueError(f"attention group kind {kind!r} unknown (choose from {ATTENTION_GROUPS})")
    ids = layout.sample_ids
    pad = ids < 0
    if kind == "full":
        key = ids
    else:
        s = ids.clamp(min=0)  # (N,)
        grids = torch.tensor(layout.grids, dtype=torch.int64).reshape(-1, 3)  # (S, 3)
        pos = layout.positions  # (N, 3)
        if kind == "spatial":
            count, local = grids[:, 0], pos[:, 0]  # groups per sample: t
        else:
            count = grids[:, 1] * grids[:, 2]  # groups per sample: h*w
            local = pos[:, 1] * grids[s, 2] + pos[:, 2]  # (N,)
        offset = torch.cumsum(count, 0) - count  # (S,) first group id of every sample
        key = offset[s] + local  # (N,)
    unique_pad = -1 - torch.arange(len(ids), dtype=torch.int64)  # (N,)
    return torch.where(pad, unique_pad, key)
