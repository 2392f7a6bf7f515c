"""Train the tokenizer on clips read from shards (``vfm tokenizer train``).

Stage order: shard loader (one pass, at most ``max_batches`` batches kept decoded in memory and
cycled) (decode the clip's frames; one bucket = the training crop, so shorter or
smaller clips are skipped alike on every run) → centre crop to ``size`` × ``size`` and the first
``frames`` frames → (B, 3, T, H, W) in [-1, 1] → :func:`train_tokenizer`. The PSNR batch is a
differently seeded draw from the same shards (a small sample has no room for a real split; give a
separate shard directory for a true held-out set).
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch

from vfm_core.config import ConfigError
from vfm_core.output_lock import output_lock
from vfm_core.progress import Progress
from vfm_core.recipes import FSQ_L2
from vfm_core.tokenizer.autoencoder import pixels_from_uint8
from vfm_core.tokenizer.config import TokenizerConfig, TokenizerConfigError, get_tokenizer_config
from vfm_core.tokenizer.fsq import FSQError, check_levels
from vfm_core.tokenizer.train import TokenizerTrainMetrics, train_tokenizer


def discrete_variant(cfg: TokenizerConfig, levels: tuple[int, ...]) -> TokenizerConfig:
    """``cfg`` with an FSQ bottleneck of ``levels`` (one latent channel per level, the
    pre-quantisation L2 of :data:`~vfm_core.recipes.FSQ_L2`; the latent shortcut kept
    when the bottleneck width allows it)."""
    width = cfg.base_channels * cfg.channel_mult[-1]
    try:
        levels = check_levels(levels)
        return dataclasses.replace(
            cfg,
            fsq_levels=levels,
            latent_channels=len(levels),
            **FSQ_L2,
            shortcuts=cfg.shortcuts and width % len(levels) == 0,
        )
    except (TokenizerConfigError, FSQError) as e:
        raise ConfigError(f"--discrete {','.join(map(str, levels))}: {e}") from None


def shard_clips(
    shards: str, *, frames: int, size: int, batch_size: int, seed: int = 0
) -> Iterator[torch.Tensor]:
    """Endless batches (B, 3, frames, size, size) in [-1, 1] from the clips in ``shards``."""
    from vfm_core.data.buckets import BucketSpec
    from vfm_core.data.loader import build_loader

    loader = build_loader(
        shards=shards,
        seed=seed,
        batch_size=batch_size,
        decode="frames",
        buckets=BucketSpec(resolutions=((size, size),), durations=(frames,)),
    )
    while True:
        batch = loader.next_batch()
        clips = []
        for s in batch.samples:
            assert s.frames is not None
            t, h, w, _ = s.frames.shape
            y, x = (h - size) // 2, (w - size) // 2
            clip = s.frames[:frames, y : y + size, x : x + size]  # (T, S, S, 3) uint8
            clips.append(torch.from_numpy(np.ascontiguousarray(clip)).permute(3, 0, 1, 2))
        if clips:
            yield pixels_from_uint8(torch.stack(clips))  # (B, 3, T, S, S) in [-1, 1]


def train_tokenizer_on_shards(
    shards: str,
    out_dir: str | Path,
    *,
    preset: str = "tok-tiny",
    steps: int = 200,
    frames: int = 5,
    size: int = 32,
    batch_size: int = 4,
    held_out: int = 16,
    seed: int = 0,
    lr: float = 2e-3,
    max_batches: int = 256,
    progress: bool | None = None,
    fsq_levels: tuple[int, ...] | None = None,
) -> TokenizerTrainMetrics:
    """Train ``preset`` on the shards' clips; write the tokenizer to ``out_dir``. Its PSNR / SSIM
    are measured on ``held_out`` crops drawn with another seed (16: two crops say little; a crop
    may miss the object and make the mean-colour baseline look strong).
    ``fsq_levels``: make it discrete with these FSQ levels (:func:`discrete_variant`). One
    writer per ``out_dir`` (:mod:`vfm_core.output_lock`): a second is refused, naming the first.
    """
    cfg = get_tokenizer_config(preset)
    if fsq_levels is not None:
        cfg = discrete_variant(cfg, fsq_levels)
    ct, cs = cfg.temporal_factor, cfg.spatial_factor
    if frames < 1 or (frames - 1) % ct or size < cs or size % cs:
        raise ConfigError(
            f"tokenizer {preset}: frames must be 1 + {ct}k and size a positive multiple of {cs}, "
            f"got frames={frames}, size={size}"
        )
    with output_lock(out_dir, what="--out"):
        return _train_locked(
            cfg,
            shards,
            out_dir,
            frames=frames,
            size=size,
            steps=steps,
            batch_size=batch_size,
            held_out=held_out,
            seed=seed,
            lr=lr,
            max_batches=max_batches,
            progress=progress,
        )


def _train_locked(
    cfg: TokenizerConfig,
    shards: str,
    out_dir: str | Path,
    *,
    frames: int,
    size: int,
    steps: int,
    batch_size: int,
    held_out: int,
    seed: int,
    lr: float,
    max_batches: int,
    progress: bool | None,
) -> TokenizerTrainMetrics:
    """:func:`train_tokenizer_on_shards` once the writer lock of ``out_dir`` is held."""
    from vfm_core.data.index import read_index

    # decode every clip once and cycle the decoded batches (decoding dominates otherwise); a
    # large dataset is capped at ``max_batches`` of them
    n = min(max_batches, -(-len(read_index(shards)) // batch_size))
    batches = shard_clips(shards, frames=frames, size=size, batch_size=batch_size, seed=seed)
    stream = []
    log = logging.getLogger(__name__)
    with Progress(n, desc="decoding tokenizer clips", unit="batch", logger=log) as bar:
        for batch in itertools.islice(batches, n):
            stream.append(batch)
            bar.update()
    try:
        held = list(
            itertools.islice(
                shard_clips(shards, frames=frames, size=size, batch_size=held_out, seed=seed + 1), 1
            )
        )
    except StopIteration:  # pragma: no cover - the loader is endless
        held = []
    _, metrics = train_tokenizer(
        cfg,
        stream,
        steps=steps,
        lr=lr,
        seed=seed,
        held_out=held or None,
        out_dir=out_dir,
        progress=progress,
    )
    return metrics
