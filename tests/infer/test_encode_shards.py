"""Encode shards: a copy of a real shard dataset with ``{key}.latent.npy`` per sample, equal to the
tokenizer's encoding of the decoded clip; the index validates, checksums hold, the trainer's shard
source reads the latents; bad inputs are named."""

from __future__ import annotations

import io

import numpy as np
import pandas as pd
import pytest
import torch

from vfm_core.config import DataConfig, ModelConfig
from vfm_core.data.index import read_index
from vfm_core.data.shard_reader import ShardError, parse_sample, read_raw, verify_shards
from vfm_core.data.shard_source import ShardLatentSource
from vfm_core.data.shards import ShardWriterConfig, write_shards
from vfm_core.tokenizer import TokenizerLoadError, load_tokenizer
from vfm_core.tokenizer.encode_shards import encode_clip, encode_shards
from vfm_core.video.io import decode_frames
from vfm_core.video.synthetic import Segment, VideoSpec, make_video

SHAPES = [(13, 32, 32), (9, 48, 40), (1, 32, 32), (17, 32, 48)]  # (frames, H, W)


def _embed(captions: list[str]) -> np.ndarray:
    rng = np.random.default_rng(len(captions))
    return rng.standard_normal((len(captions), 16)).astype(np.float32)


@pytest.fixture
def shards(tmp_path) -> str:
    rows = []
    for i, (f, h, w) in enumerate(SHAPES):
        path = tmp_path / "clips" / f"c{i}.mp4"
        path.parent.mkdir(exist_ok=True)
        spec = VideoSpec(
            width=w, height=h, fps=8.0, seed=i, segments=(Segment(kind="moving", n_frames=f),)
        )
        make_video(path, spec)
        rows.append(
            {
                "clip_id": f"c{i}",
                "uri": str(path),
                "caption": f"clip {i}",
                "n_frames": f,
                "height": h,
                "width": w,
            }
        )
    src = str(tmp_path / "src")
    write_shards(
        pd.DataFrame(rows), src, embed=_embed, config=ShardWriterConfig(target_shard_bytes=1)
    )  # one sample per shard
    return src


def test_encode_shards_adds_latents(shards, tiny_tokenizer, tmp_path):
    dst = str(tmp_path / "dst")
    res = encode_shards(shards, dst, tokenizer=tiny_tokenizer)
    assert (res.samples, res.encoded, res.shards) == (4, 4, 4)
    index = read_index(dst)
    verify_shards(index, checksum=True)
    assert index.meta["latents"]["compression"] == [4, 8, 8]
    tok = load_tokenizer(tiny_tokenizer)
    expect = {0: (4, 4, 4, 4), 1: (4, 3, 6, 5), 2: (4, 1, 4, 4), 3: (4, 5, 4, 6)}
    src = read_index(shards)
    for i in range(4):
        s = parse_sample(read_raw(index, i), index.samples.at[i, "key"], embedding_dim=16)
        assert s.latent.shape == expect[i] == tuple(index.samples.at[i, "latent_shape"])
        frames = decode_frames(io.BytesIO(s.mp4))
        ref = encode_clip(tok, frames, where="test")
        assert np.allclose(s.latent, ref, atol=1e-5)
        orig = parse_sample(read_raw(src, i), src.samples.at[i, "key"], embedding_dim=16)
        assert orig.mp4 == s.mp4 and np.array_equal(orig.txt_emb, s.txt_emb)
        assert orig.meta == s.meta and orig.latent is None
    # a second pass keeps existing latents unless asked to overwrite
    again = encode_shards(dst, str(tmp_path / "dst2"), tokenizer=tiny_tokenizer)
    assert again.encoded == 0


def test_trainer_shard_source_reads_the_latents(shards, tiny_tokenizer, tmp_path):
    dst = str(tmp_path / "dst")
    encode_shards(shards, dst, tokenizer=tiny_tokenizer)
    data = DataConfig(
        source="shards", shards=dst, batch_size=2, latent_frames=2, latent_height=4, latent_width=4
    )
    model = ModelConfig(in_channels=4, text_dim=16, text_len=2, patch=(1, 2, 2))
    batch = ShardLatentSource(data, model).next_batch()
    assert batch.values.shape == (2, 4, 2, 4, 4) and torch.isfinite(batch.values).all()


def test_encode_shards_bad_inputs(shards, tiny_tokenizer, tmp_path):
    with pytest.raises(ShardError, match="must differ from the source"):
        encode_shards(shards, shards, tokenizer=tiny_tokenizer)
    with pytest.raises(TokenizerLoadError, match="tokenizer weights not found"):
        encode_shards(shards, str(tmp_path / "o"), tokenizer=tmp_path / "nope")
    with pytest.raises(ShardError, match="smaller than the spatial factor 8"):
        encode_clip(load_tokenizer(tiny_tokenizer), np.zeros((5, 4, 4, 3), np.uint8), where="x")
