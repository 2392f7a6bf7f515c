"""Packed training in the single-process Trainer (``data.max_tokens``): the shard source packs
images and videos of several native latent sizes (cropped to multiples of the patch) with their
own captions; a step's loss is the mean over its samples of the EDM loss each sample has alone;
tokens/s and MFU count the real tokens; a resume in a new process is bit-identical."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from vfm_core.config import ConfigError, apply_overrides, validate
from vfm_core.data.shard_source import ShardLatentSource
from vfm_core.geometry import unpack_latents
from vfm_core.perf.flops import train_flops
from vfm_core.recipes import get_recipe
from vfm_core.train.trainer import Trainer

MAX_TOKENS = 32
PATCH = (1, 2, 2)  # dit-tiny's
SMALL = [
    "model.hidden=64",
    "model.depth=2",
    "model.text_dim=16",
    "train.device=cpu",
    "optim.warmup_steps=1",
    "optim.lr=0.002",
    "train.ema_decay=0.9",
    "data.batch_size=2",
    f"data.max_tokens={MAX_TOKENS}",
    "data.source=shards",
]


@pytest.fixture(scope="module")
def shards(tmp_path_factory, mixed_shards) -> Path:
    return mixed_shards.write(tmp_path_factory.mktemp("mixed"))


def _cfg(shards: Path, *extra: str):
    return apply_overrides(get_recipe("dit-tiny"), [*SMALL, f"data.shards={shards}", *extra])


def test_max_tokens_is_validated_with_the_key_named(shards):
    cfg = _cfg(shards)
    bad = [
        (["data.max_tokens=-4"], r"data.max_tokens: must be >= 0"),
        (
            ["data.source=synthetic", "data.shards="],
            r"data.max_tokens=32: packing needs data.source='shards'",
        ),
    ]
    for overrides, msg in bad:
        with pytest.raises(ConfigError, match=msg):
            validate(apply_overrides(cfg, overrides))
    cp3 = dataclasses.replace(cfg, parallel=dataclasses.replace(cfg.parallel, cp=3))
    with pytest.raises(ConfigError, match=r"data.max_tokens=32 is not a multiple of .*cp \* "):
        validate(cp3)
    ar = dataclasses.replace(
        cfg,
        model=dataclasses.replace(cfg.model, arch="ar", patch=(1, 1, 1)),
        parallel=dataclasses.replace(cfg.parallel, cp=3),
    )
    with pytest.raises(
        ConfigError,
        match=r"data.max_tokens=32 is not a multiple of 2 x "
        r"parallel.cp \* parallel.tp .* = 6",
    ):
        validate(ar)
    small = apply_overrides(cfg, ["data.max_tokens=18"])  # the 3x4x6 video has 18 tokens: fits
    ShardLatentSource(small.data, small.model)
    small = apply_overrides(cfg, ["data.max_tokens=17"])
    with pytest.raises(
        ConfigError,
        match=r"data.max_tokens=17 is smaller than the largest "
        r"sample \(mixed\d+: 18 tokens",
    ):
        ShardLatentSource(small.data, small.model)


def test_source_packs_images_and_videos_at_their_native_sizes(shards, mixed_shards):
    cfg = _cfg(shards)
    src = ShardLatentSource(cfg.data, cfg.model)
    seen, positions, keys = set(), [], set()
    for _ in range(6):  # 6 steps of 2 packs: more than one epoch of 12 samples
        batch = src.next_batch()
        assert batch.packed and 1 <= len(batch.layouts) <= 2
        assert batch.values.shape == (len(batch.layouts), MAX_TOKENS, 16)  # (P, length, C*p)
        for p in batch.packs():
            s, (layout,) = p.n_samples, p.layouts
            assert p.text.shape == (s, 8, 16) and p.text_lengths.shape == (s,)
            assert layout.length == MAX_TOKENS
            tokens = 0
            latents = unpack_latents(p.values[0], layout, PATCH, 4)
            for z, key, n in zip(latents, p.keys, p.text_lengths.tolist(), strict=True):
                c, t, h, w = z.shape
                assert c == 4 and h % 2 == 0 and w % 2 == 0
                want = mixed_shards.LATENTS[int(key[-3:])]
                assert (t, h, w) == (want[1], want[2] // 2 * 2, want[3] // 2 * 2)
                assert n == min(8, 2 + int(key[-3:]) % 10)  # caption cut to text_len
                assert p.text[p.keys.index(key), n:].abs().sum() == 0  # zero padded
                tokens += t * (h // 2) * (w // 2)
                seen.add((t, h, w))
            assert tokens <= MAX_TOKENS
            positions += p.positions
            keys.update(p.keys)
    assert (1, 4, 4) in seen and (4, 4, 4) in seen and (2, 4, 4) in seen  # 5 -> 4 cropped too
    assert len({t for t, _, _ in seen}) >= 3  # images and videos of several lengths
    assert len(positions) == len(set(positions)) > 12  # global positions: unique draw keys
    assert len(keys) == 12 and sorted(positions)[:12] == list(range(12))  # epoch 1 in full


def test_packed_step_is_the_mean_of_each_sample_alone_and_counts_real_tokens(shards):
    cfg = _cfg(shards, "diffusion.cond_dropout=0.5")
    tr = Trainer(cfg)
    for _ in range(12):  # a batch with padding, so real tokens and padded tokens differ
        batch = tr.source.next_batch()
        if any(layout.n_tokens < layout.length for layout in batch.layouts):
            break
    obj = tr.objective  # counter-based: the draws train_step will make at this step
    want = []
    with torch.no_grad():
        for p in batch.packs():
            z_sigma, noise, keep = obj.pack_draws(p, tr.step, noise=True)
            mean, std = obj.edm.log_sigma_normal()
            sigma = (mean + std * z_sigma).exp().float()
            assert sigma.shape == keep.shape == (p.n_samples,)
            noise = unpack_latents(noise, p.layouts[0], PATCH, 4)  # [(C, T, H, W)]
            for i, z in enumerate(unpack_latents(p.values[0], p.layouts[0], PATCH, 4)):
                n = int(p.text_lengths[i])
                text = p.text[i : i + 1, :n] * keep[i]  # (1, n, Dt)
                loss = obj.edm.loss(
                    tr.model, z[None], text, sigma=sigma[i : i + 1], noise=noise[i][None]
                )
                want.append(loss.item())
    assert len(want) == batch.n_samples > 2
    out = tr.train_step(batch)
    assert out["loss"] == pytest.approx(np.mean(want), rel=1e-5)
    assert tr.step == 1 and np.isfinite(out["grad_norm"]) and out["grad_norm"] > 0

    # throughput and MFU from the real tokens, each sample's FLOPs at its own length
    grids = [g for layout in batch.layouts for g in layout.grids]
    real = sum(t * h * w for t, h, w in grids)
    assert real < sum(layout.length for layout in batch.layouts)  # padding is not counted
    flops = sum(
        train_flops(tr.cfg.model, seq_lens=g[0] * g[1] * g[2], grid=g, text_len=8)["total"]
        for g in grids
    )
    m = tr.metrics(out, step_time=2.0, data_time=0.5)
    assert m["tokens_per_s"] == pytest.approx(real / 2.0)
    assert m["mfu"] == pytest.approx(flops / 2.0 / tr.peak_flops, rel=1e-9)
    assert m["data_wait"] == 0.25
    # captions of 9-11 words, cut to dit-tiny's text_len of 8: counted (all ranks, so far)
    assert m["captions_cut"] == tr.source.captions_cut > 0


def vfm(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    argv = [sys.executable, "-m", "vfm_core.cli", *args]
    return subprocess.run(argv, capture_output=True, text=True, env=env, timeout=300)


@pytest.mark.slow
def test_packed_resume_in_new_process_is_bit_identical_and_loss_falls(shards, tmp_path):
    sets = [
        a for s in [*SMALL, f"data.shards={shards}", "train.ckpt_every=4"] for a in ("--set", s)
    ]
    straight, split = tmp_path / "straight", tmp_path / "split"
    common = ["train", "--recipe", "dit-tiny", "--no-mlflow", *sets]
    r = vfm(*common, "--steps", "8", "--out", str(straight))
    assert r.returncode == 0, r.stderr[-3000:]
    r = vfm(*common, "--steps", "4", "--out", str(split))
    assert r.returncode == 0, r.stderr[-3000:]
    r = vfm(*common, "--steps", "8", "--out", str(split), "--resume")
    assert r.returncode == 0, r.stderr[-3000:]
    a, b = ([json.loads(x) for x in (d / "metrics.jsonl").open()] for d in (straight, split))
    assert [x["step"] for x in a] == [x["step"] for x in b] == list(range(1, 9))
    assert [x["loss"] for x in a] == [x["loss"] for x in b]  # exact, every step
    assert [x["grad_norm"] for x in a] == [x["grad_norm"] for x in b]
    assert all(x["mfu"] > 0 and x["tokens_per_s"] > 0 for x in a)
    state = json.loads((split / "checkpoints" / "step_00000004" / "state.json").read_text())
    assert state["state"]["data"]["max_tokens"] == MAX_TOKENS
    first, last = np.mean([x["loss"] for x in a[:3]]), np.mean([x["loss"] for x in a[-3:]])
    assert last < first, [x["loss"] for x in a]


def test_packs_from_clips_through_the_tokenizer(tmp_path, mixed_shards):
    """Shards without latents: every clip is cropped to its token grid in pixels (frames
    1 + 4 (T - 1), size grid * patch * 8) and encoded; a packed step trains on them."""
    from vfm_core.tokenizer import CausalVideoAutoencoder, get_tokenizer_config, save_tokenizer

    torch.manual_seed(0)
    save_tokenizer(CausalVideoAutoencoder(get_tokenizer_config("tok-tiny")), tmp_path / "tok")
    clips = mixed_shards.write(tmp_path / "mixed", latents=False)
    cfg = _cfg(clips, f"data.tokenizer={tmp_path / 'tok'}")
    tr = Trainer(cfg)
    batch = tr.source.next_batch()
    for p in batch.packs():
        latents = unpack_latents(p.values[0], p.layouts[0], PATCH, 4)
        for z, key in zip(latents, p.keys, strict=True):
            want = mixed_shards.LATENTS[int(key[-3:])]
            assert tuple(z.shape) == (4, want[1], want[2] // 2 * 2, want[3] // 2 * 2)
            assert torch.isfinite(z).all()
    out = tr.train_step(batch)
    assert np.isfinite(out["loss"]) and tr.step == 1
