"""The prompt of an autoregressive generation: read, checked, and prefilled over CP ranks.

**Prompt** (``vfm generate --prompt-tokens FILE | --prompt-video PATH``, ``--prompt-frames K``):
the first K latent frames of a token file (T, h, w) int ids as ``vfm generate`` writes them, or of
a video encoded with the run's discrete tokenizer (its first ``1 + t_c·(K-1)`` frames: the
tokenizer is causal, so they alone decide the first K latent frames). The prompt is those
``K·h·w`` ids in raster order; its (h, w) grid must be the requested one (``--size``).

**Context-parallel prefill** (:class:`SplitPrefill`, ``--nproc N``), in order:

1. *layout*: the m = P + 1 prefill inputs (BOS and the P prompt tokens; the last one predicts the
   first sampled token) are padded at the end to a multiple of 2N and cut into the balanced zigzag
   chunks of :func:`~vfm_core.parallel.context.causal_positions` (rank r: chunks r and 2N-1-r), the
   split the training ring uses. Padding comes after every real position, so under causal
   attention no real query sees it;
2. *forward*: each rank runs the model on its positions; self-attention is the causal ring
   (:func:`~vfm_core.parallel.context.ring_attention` with positions), cross-attention and the MLP
   act per position, so text conditioning and the CFG batch (cond, uncond) work unchanged;
3. *gather*: the keys/values of every layer (all layers in one ``all_gather``) are put back in
   raster order, padding dropped, and appended to the full-length caches on every rank; the logits
   of input m-1 are broadcast from the rank holding it;
4. *decode*: every rank continues identically (same caches, logits and seeded generator);
   :func:`sync_tokens` then broadcasts rank 0's ids, so the ranks agree bitwise regardless.

Equivalence with one rank: the ring merges partial softmaxes by log-sum-exp, so the prefill
logits agree up to float32 rounding (tested <= 1e-5) and the sampled tokens are the same.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from vfm_core.geometry import Grid
from vfm_core.infer.context_parallel import sampling_cp_group
from vfm_core.infer.frame_prompt import prompt_pixels
from vfm_core.infer.shapes import GenerateError
from vfm_core.models.ar import CausalVideoTransformer
from vfm_core.models.attention import KVCache
from vfm_core.parallel.context import ContextParallelAttention, causal_positions

__all__ = ["PrefillLayout", "SplitPrefill", "load_prompt", "prefill_layout", "sync_tokens"]


# ------------------------------------------------------------------ the prompt
def load_prompt(
    *,
    tokens: str | Path | None,
    video: str | Path | None,
    frames: int,
    grid: Grid,
    vocab_size: int,
    tokenizer: Any = None,
    spatial_factor: int,
) -> torch.Tensor | None:
    """(1, K·h·w) prompt ids in raster order for a video of latent ``grid`` (T', h, w); None
    without a prompt. Every user error is a one-line :class:`GenerateError`."""
    if tokens is None and video is None:
        return None
    if tokens is not None and video is not None:
        raise GenerateError("--prompt-tokens and --prompt-video: give one prompt, not both")
    if isinstance(frames, bool) or not isinstance(frames, int) or frames < 1:
        raise GenerateError(f"--prompt-frames: must be an integer >= 1, got {frames!r}")
    if frames > grid[0]:
        raise GenerateError(
            f"--prompt-frames {frames}: the prompt is longer than the video's {grid[0]} latent "
            "frames (raise --frames or lower --prompt-frames)"
        )
    if tokens is not None:
        ids = _read_tokens(Path(tokens), frames)  # (K, h', w')
        flag = f"--prompt-tokens {tokens}"
    else:
        ids = _encode_video(Path(video), frames, grid, tokenizer, spatial_factor)
        flag = f"--prompt-video {video}"
    if tuple(ids.shape[1:]) != tuple(grid[1:]):
        (h, w), s = ids.shape[1:], spatial_factor
        raise GenerateError(
            f"{flag}: token grid {h}x{w} does not match the requested size's {grid[1]}x{grid[2]} "
            f"(use --size {h * s}x{w * s})"
        )
    if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= vocab_size):
        raise GenerateError(
            f"{flag}: ids must lie in [0, {vocab_size}) (model.vocab_size), got min "
            f"{int(ids.min())} max {int(ids.max())}"
        )
    return ids.reshape(1, -1)  # (1, K*h*w)


def _read_tokens(path: Path, frames: int) -> torch.Tensor:
    """The first ``frames`` latent frames (K, h, w) int64 of a ``.tokens.npy`` file."""
    flag = f"--prompt-tokens {path}"
    if not path.is_file():
        raise GenerateError(f"{flag}: no such file")
    try:
        arr = np.load(path, allow_pickle=False)
    except (OSError, ValueError, EOFError) as e:
        raise GenerateError(f"{flag}: not a readable .npy file ({e})") from None
    if not isinstance(arr, np.ndarray) or not np.issubdtype(arr.dtype, np.integer):
        raise GenerateError(
            f"{flag}: must hold integer token ids, got {getattr(arr, 'dtype', arr)}"
        )
    if arr.ndim != 3:
        raise GenerateError(
            f"{flag}: expected ids (T, h, w) as `vfm generate` writes them, got shape {arr.shape}"
        )
    if arr.shape[0] < frames:
        raise GenerateError(
            f"{flag}: holds {arr.shape[0]} latent frames, --prompt-frames asks for {frames}"
        )
    return torch.from_numpy(arr[:frames].astype(np.int64))  # (K, h, w)


def _encode_video(
    path: Path, frames: int, grid: Grid, tokenizer: Any, spatial_factor: int
) -> torch.Tensor:
    """(K, h, w) ids of the first ``1 + t_c·(K-1)`` frames of a video, through the tokenizer."""
    flag = f"--prompt-video {path}"
    if tokenizer is None:
        raise GenerateError(
            f"{flag}: encoding a video prompt needs the run's discrete tokenizer (--tokenizer, or "
            "data.tokenizer in the run config); runs without one take --prompt-tokens FILE"
        )
    size = (grid[1] * spatial_factor, grid[2] * spatial_factor)
    x = prompt_pixels(path, flag, frames, size, tokenizer)  # (1, 3, F, H, W)
    with torch.no_grad():
        ids = tokenizer.encode_tokens(x)  # (1, K, h, w)
    return ids[0].long()  # (K, h, w)


# ------------------------------------------------------------------ the split prefill
@dataclass(kw_only=True, slots=True, frozen=True)
class PrefillLayout:
    """Where the m prefill inputs live on ``world`` ranks (padded to a multiple of 2·world)."""

    length: int
    """Real inputs m (BOS and the prompt)."""
    positions: torch.Tensor
    """(world, n) global input positions of every rank's n inputs; >= ``length``: padding."""

    @property
    def padded(self) -> int:
        return self.positions.numel()

    def owner(self, position: int) -> tuple[int, int]:
        """(rank, local index) holding global input ``position``."""
        rank, j = (self.positions == position).nonzero()[0].tolist()
        return rank, j

    def to_raster(self, parts: torch.Tensor, dim: int) -> torch.Tensor:
        """Rank chunks concatenated in rank order along ``dim`` (world·n) -> the m real
        positions in raster order along ``dim``."""
        order = self.positions.flatten().argsort()[: self.length]  # (m,)
        return parts.index_select(dim, order.to(parts.device))


def prefill_layout(length: int, world: int) -> PrefillLayout:
    """Balanced zigzag placement of ``length`` inputs padded to a multiple of 2·world."""
    chunks = 2 * world
    padded = -(-length // chunks) * chunks
    return PrefillLayout(length=length, positions=causal_positions(padded // world, world))


@contextmanager
def _causal_ring(model: CausalVideoTransformer, group: dist.ProcessGroup) -> Iterator[None]:
    """Self-attention of every block as the balanced causal ring over ``group`` (the core
    swapped, its kernel kept), then restored."""
    mods = [block.self_attn[0] for block in model.blocks.values()]
    before = [m.core for m in mods]
    for m in mods:
        m.core = ContextParallelAttention(group, "ring", local=m.core, balanced=True)
    try:
        yield
    finally:
        for m, core in zip(mods, before, strict=True):
            m.core = core


class SplitPrefill:
    """A :data:`~vfm_core.infer.ar_sample.Prefill` whose forward is split over all ranks of the
    default process group (see the module docstring); every rank calls it with the same inputs
    and gets the same caches and logits."""

    def __init__(self, device_type: str = "cpu"):
        self.group, self.rank, self.world = sampling_cp_group(device_type)

    @torch.no_grad()
    def __call__(
        self,
        model: CausalVideoTransformer,
        inputs: torch.Tensor,  # (B', m) input ids
        text: torch.Tensor,  # (B', L, Dt)
        rope: torch.Tensor,  # (m, d/2)
        caches: list[KVCache],
    ) -> torch.Tensor:
        if any(c.length for c in caches):
            raise ValueError("SplitPrefill: the caches must be empty (the prefill comes first)")
        b, m = inputs.shape
        lay = prefill_layout(m, self.world)
        pad = lay.padded - m
        inputs = torch.cat([inputs, inputs.new_full((b, pad), model.bos)], dim=1)  # (B', M)
        rope = torch.cat([rope, rope.new_zeros(pad, rope.shape[1])])  # (M, d/2), pads: angle 0
        idx = lay.positions[self.rank].to(inputs.device)  # (n,) this rank's positions
        local = model.new_caches(idx.numel())
        with _causal_ring(model, self.group):
            logits = model.forward_ids(inputs[:, idx], text, rope[idx], caches=local)  # (B', n, V)
        kv = torch.stack([t for c in local for t in (c.k, c.v)])  # (2·depth, B', Hkv, n, d)
        parts = [torch.empty_like(kv) for _ in range(self.world)]
        dist.all_gather(parts, kv, group=self.group)
        full = lay.to_raster(torch.cat(parts, dim=3), dim=3)  # (2·depth, B', Hkv, m, d)
        for i, cache in enumerate(caches):
            cache.append(full[2 * i], full[2 * i + 1])
        src, j = lay.owner(m - 1)
        last = logits[:, j].contiguous()  # (B', V); the owner's is broadcast
        dist.broadcast(last, src=dist.get_global_rank(self.group, src), group=self.group)
        return last  # (B', V)


def sync_tokens(tokens: torch.Tensor) -> torch.Tensor:
    """Rank 0's tokens on every rank (decoding is identical everywhere; this makes it certain)."""
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        tokens = tokens.contiguous()
        dist.broadcast(tokens, src=0)
    return tokens
