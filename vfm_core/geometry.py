"""Token geometry shared by the data path and the models: latent grids, the layout of a pack of
samples in one token sequence (THD), and the per-token side information a packed forward needs.

Neither ``data`` nor ``models`` owns it: the loader builds a :class:`PackLayout` once per pack,
the models read it (3D RoPE angles per token, attention groups, cross-attention masks), the
objectives average per-token losses per sample with it. Torch only, no parallelism.

A pack carries everything the model needs to keep its samples apart:

* ``cu_seqlens`` (S+1,) — cumulative sample lengths (THD / varlen layout, flash-attn style);
* ``sample_ids`` (N,) — sample of every token (-1 for padding);
* ``positions`` (N, 3) — (t, h, w) of every token inside *its own* sample, for 3D RoPE;
* attention groups per self-attention layout (:func:`attention_groups`) and the cross-attention
  mask of each token to its own caption (:func:`cross_attention_mask`).

Losses are averaged per sample first (:func:`per_sample_mean`), then over samples, so a long
video does not outweigh an image by its token count.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from vfm_core.errors import UserError

Grid = tuple[int, int, int]  # latent token grid (t, h, w) after patchify


def rope_dims(head_dim: int) -> tuple[int, int, int]:
    """Split of the rotary head dimension over (t, h, w): h and w get equal even shares, t the rest
    (Cosmos / Lumina style factorisation)."""
    dh = dw = (head_dim // 6) * 2
    dt = head_dim - dh - dw
    return dt, dh, dw


def grid_tokens(grid: Grid) -> int:
    return grid[0] * grid[1] * grid[2]


def default_grid(seq_len: int, *, spatial_to_temporal: float = 4.0) -> Grid:
    """A plausible token grid (t, h, w) with t·h·w == seq_len, for ST-DiT when only N is known.

    Rule: t is the divisor of ``seq_len`` closest, on a log scale, to the t that solves
    ``t · (spatial_to_temporal · t)² = seq_len``, i.e. a clip whose spatial side (in tokens) is
    ``spatial_to_temporal`` times its temporal length; then h ≤ w is the most nearly square
    factorisation of ``seq_len / t``. The default 4 reproduces the paper recipes: 56,320 tokens ->
    (16, 55, 64) against the real (16, 44, 80) grid — same t and frame size, so the same ST-DiT
    attention FLOPs. Only t and h·w matter for the count; pass the real grid when it is known.
    """
    if seq_len <= 0:
        raise ValueError(f"seq_len must be positive, got {seq_len}")
    target = (seq_len / spatial_to_temporal**2) ** (1 / 3)
    divisors = [d for d in range(1, seq_len + 1) if seq_len % d == 0]
    t = min(divisors, key=lambda d: (abs(math.log(d / target)), d))
    s = seq_len // t
    h = max(d for d in range(1, math.isqrt(s) + 1) if s % d == 0)
    return (t, h, s // h)


def sample_grids(seq_lens: list[int], grid: Grid | Sequence[Grid] | None) -> list[Grid]:
    """One token grid per sample of ``seq_lens`` tokens: ``grid`` shared by all, one each, or
    :func:`default_grid` of each (None); ValueError when a grid does not hold its sample."""
    if grid is None:
        return [default_grid(s) for s in seq_lens]
    if len(grid) == 3 and all(isinstance(g, int) for g in grid):
        grids = [tuple(grid)] * len(seq_lens)  # one grid shared by every sample
    else:
        grids = [tuple(g) for g in grid]
    if len(grids) != len(seq_lens):
        raise ValueError(f"{len(grids)} grids for {len(seq_lens)} sequences")
    for s, g in zip(seq_lens, grids, strict=True):
        if len(g) != 3 or math.prod(g) != s:
            raise ValueError(f"grid {g} has {math.prod(g)} tokens, seq_len is {s}")
    return grids  # type: ignore[return-value]


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


# ------------------------------------------------------------------ patches and packs
class ShapeError(UserError, ValueError):
    """A tensor's shape does not fit the model (e.g. latent size not divisible by the patch)."""


def patchify(x: torch.Tensor, patch: Grid) -> tuple[torch.Tensor, Grid]:
    """(B, C, T, H, W) latents -> (B, N, C*pt*ph*pw) tokens in (t, h, w) raster order, plus the
    grid."""
    if x.ndim != 5:
        raise ShapeError(f"latents must be (B, C, T, H, W), got shape {tuple(x.shape)}")
    b, c, t, h, w = x.shape
    pt, ph, pw = patch
    if t % pt or h % ph or w % pw:
        raise ShapeError(
            f"latent shape (T, H, W)=({t}, {h}, {w}) is not divisible by the patch {tuple(patch)}"
        )
    gt, gh, gw = t // pt, h // ph, w // pw
    x = x.reshape(b, c, gt, pt, gh, ph, gw, pw)  # (B, C, gt, pt, gh, ph, gw, pw)
    x = x.permute(0, 2, 4, 6, 1, 3, 5, 7)  # (B, gt, gh, gw, C, pt, ph, pw)
    return x.reshape(b, gt * gh * gw, c * pt * ph * pw), (gt, gh, gw)  # (B, N, C*P)


def unpatchify(tokens: torch.Tensor, grid: Grid, patch: Grid, channels: int) -> torch.Tensor:
    """(B, N, C*pt*ph*pw) tokens -> (B, C, T, H, W); exact inverse of :func:`patchify`."""
    b = tokens.shape[0]
    gt, gh, gw = grid
    pt, ph, pw = patch
    x = tokens.reshape(b, gt, gh, gw, channels, pt, ph, pw)
    x = x.permute(0, 4, 1, 5, 2, 6, 3, 7)  # (B, C, gt, pt, gh, ph, gw, pw)
    return x.reshape(b, channels, gt * pt, gh * ph, gw * pw)


def pack_latents(
    latents: Sequence[torch.Tensor],
    patch: Grid,
    length: int | None = None,
    *,
    layout: PackLayout | None = None,
) -> tuple[torch.Tensor, PackLayout]:
    """Per-sample latents [(C, T_s, H_s, W_s)] -> packed patch tokens (length, C*P) (zero padded
    up to ``length``, default: no padding) and their layout; ``layout``: the pack's layout when
    it was already built (the loader's plan), checked against the latents' grids."""
    if not latents:
        raise ValueError("pack_latents: no latents to pack")
    tokens, grids = [], []
    for i, z in enumerate(latents):
        if z.ndim != 4:
            raise ShapeError(f"latents[{i}]: expected (C, T, H, W), got {tuple(z.shape)}")
        tok, grid = patchify(z[None], patch)  # (1, n_s, C*P)
        tokens.append(tok[0])
        grids.append(grid)
    if layout is None:
        layout = PackLayout.from_grids(grids, length)
    elif [tuple(g) for g in layout.grids] != grids:
        raise ShapeError(f"latent grids {grids} do not match the pack's layout {layout.grids}")
    return pack_tokens(tokens, layout), layout  # (length, C*P)


def unpack_latents(
    tokens: torch.Tensor, layout: PackLayout, patch: Grid, channels: int
) -> list[torch.Tensor]:
    """Inverse of :func:`pack_latents`: (length, C*P) -> [(C, T_s, H_s, W_s)]."""
    return [
        unpatchify(t[None], grid, patch, channels)[0]  # (C, T, H, W)
        for t, grid in zip(unpack_tokens(tokens, layout), layout.grids)
    ]
