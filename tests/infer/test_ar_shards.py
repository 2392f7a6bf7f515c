"""The autoregressive family from shards: encode-shards with a discrete tokenizer writes the FSQ
codes and their int32 ids ({key}.tokens.npy, on the latent grid); ar-tiny trains from those
shards; a continuous tokenizer or one with another vocabulary is refused in one line."""

from __future__ import annotations

import io
import tarfile

import numpy as np
import pandas as pd
import pytest

from vfm_core.config import ConfigError, apply_overrides
from vfm_core.data.index import read_index
from vfm_core.data.shard_source import make_source
from vfm_core.data.shards import ShardWriterConfig, write_shards
from vfm_core.infer.encode_shards import encode_shards
from vfm_core.recipes import get_recipe
from vfm_core.tokenizer import TokenizerConfig, save_tokenizer
from vfm_core.tokenizer.autoencoder import CausalVideoAutoencoder
from vfm_core.tokenizer.config import get_tokenizer_config
from vfm_core.train.main import run_training


def _embed(captions: list[str]) -> np.ndarray:
    rng = np.random.default_rng(len(captions))
    return rng.standard_normal((len(captions), 384)).astype(np.float32)


@pytest.fixture(scope="module")
def token_shards(tmp_path_factory):
    from vfm_core.video.synthetic import Segment, VideoSpec, make_video

    root = tmp_path_factory.mktemp("ar-shards")
    rows = []
    for i in range(4):
        path = root / "clips" / f"c{i}.mp4"
        path.parent.mkdir(exist_ok=True)
        make_video(path, VideoSpec(width=64, height=64, fps=8.0, seed=i,
                                   segments=(Segment(kind="moving", n_frames=9),)))  # fmt: skip
        rows.append({"clip_id": f"c{i}", "uri": str(path), "caption": f"clip {i}",
                     "n_frames": 9, "height": 64, "width": 64})  # fmt: skip
    write_shards(pd.DataFrame(rows), str(root / "src"), embed=_embed,
                 config=ShardWriterConfig(target_shard_bytes=1))  # fmt: skip
    tok = save_tokenizer(CausalVideoAutoencoder(get_tokenizer_config("tok-tiny-discrete")),
                         root / "tok").parent  # fmt: skip
    encode_shards(str(root / "src"), str(root / "dst"), tokenizer=tok)
    return root, tok


def test_encoded_shards_hold_token_ids(token_shards):
    root, _ = token_shards
    index = read_index(str(root / "dst"))
    assert index.meta["latents"]["fsq_levels"] == [8, 5, 5, 5]
    name = index.shards.iloc[0]["name"]
    with tarfile.open(root / "dst" / name) as tar:
        member = next(m for m in tar if m.name.endswith(".tokens.npy"))
        ids = np.load(io.BytesIO(tar.extractfile(member).read()), allow_pickle=False)
    assert ids.dtype == np.int32 and ids.shape == (3, 8, 8)
    assert ids.min() >= 0 and ids.max() < 1000


def test_ar_tiny_trains_from_token_shards(token_shards, tmp_path):
    root, tok = token_shards
    sets = ["data.source=shards", f"data.shards={root / 'dst'}", f"data.tokenizer={tok}",
            "data.batch_size=2", "model.depth=2", "train.steps=3", "tracking.mlflow=false"]
    cfg = apply_overrides(get_recipe("ar-tiny"), sets)
    summary = run_training(cfg, out_dir=tmp_path / "run", progress=False)
    assert summary["step"] == 3 and np.isfinite(summary["metrics"]["loss"])


def test_tokenizers_that_do_not_fit_are_refused(token_shards, tmp_path):
    root, _ = token_shards
    base = ["data.source=shards", f"data.shards={root / 'dst'}"]
    with pytest.raises(ConfigError, match="data.tokenizer=DIR"):
        cfg = apply_overrides(get_recipe("ar-tiny"), base)
        make_source(cfg.data, cfg.model)
    cont = save_tokenizer(CausalVideoAutoencoder(TokenizerConfig()), tmp_path / "c").parent
    cfg = apply_overrides(get_recipe("ar-tiny"), [*base, f"data.tokenizer={cont}"])
    with pytest.raises(ConfigError, match="it is continuous"):
        make_source(cfg.data, cfg.model)


def test_ar_tiny_trains_packed_from_token_shards(token_shards, tmp_path):
    """Two 192-token videos per 400-token pack: causal document masks, real tokens only."""
    root, tok = token_shards
    sets = ["data.source=shards", f"data.shards={root / 'dst'}", f"data.tokenizer={tok}",
            "data.batch_size=1", "data.max_tokens=400", "model.depth=2", "train.steps=3",
            "tracking.mlflow=false"]  # fmt: skip
    cfg = apply_overrides(get_recipe("ar-tiny"), sets)
    summary = run_training(cfg, out_dir=tmp_path / "run", progress=False)
    assert summary["step"] == 3 and np.isfinite(summary["metrics"]["loss"])
    assert summary["metrics"]["tokens_per_s"] > 0
