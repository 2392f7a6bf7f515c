"""Tiny randomly initialised `transformers` models saved to a temp dir (no download)."""

from __future__ import annotations

from pathlib import Path

import pytest

WORDS = ["a", "red", "blue", "circle", "square", "moving", "over", "texture", "the", "video"]


def _tokenizer(path: Path):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {w: i for i, w in enumerate(["[PAD]", "[BOS]", "[EOS]", "[UNK]", *WORDS])}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token="[PAD]",
        bos_token="[BOS]",
        eos_token="[EOS]",
        unk_token="[UNK]",
    )
    fast.save_pretrained(path)
    return fast


@pytest.fixture(scope="session")
def tiny_vlm(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """ViT encoder + GPT-2 decoder (VisionEncoderDecoderModel), random weights, ~100k params."""
    import torch
    from transformers import (
        GPT2Config,
        VisionEncoderDecoderConfig,
        VisionEncoderDecoderModel,
        ViTConfig,
        ViTImageProcessor,
    )

    path = tmp_path_factory.mktemp("tiny-vlm")
    tok = _tokenizer(path)
    enc = ViTConfig(
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=64,
        image_size=32,
        patch_size=8,
    )
    dec = GPT2Config(
        vocab_size=len(tok),
        n_embd=32,
        n_layer=1,
        n_head=2,
        n_positions=64,
        add_cross_attention=True,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
    )
    cfg = VisionEncoderDecoderConfig.from_encoder_decoder_configs(enc, dec)
    cfg.decoder_start_token_id = tok.bos_token_id
    cfg.pad_token_id = tok.pad_token_id
    cfg.eos_token_id = tok.eos_token_id
    torch.manual_seed(0)
    model = VisionEncoderDecoderModel(config=cfg)
    model.generation_config.decoder_start_token_id = tok.bos_token_id
    model.generation_config.pad_token_id = tok.pad_token_id
    model.generation_config.eos_token_id = tok.eos_token_id
    # random weights: keep special tokens out of the first words so the caption is never empty
    model.generation_config.min_new_tokens = 3
    model.generation_config.suppress_tokens = [tok.pad_token_id, tok.bos_token_id, tok.unk_token_id]
    model.save_pretrained(path)
    ViTImageProcessor(size={"height": 32, "width": 32}).save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def tiny_vit(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random ViT image model (for HFImageEmbedder)."""
    import torch
    from transformers import ViTConfig, ViTImageProcessor, ViTModel

    path = tmp_path_factory.mktemp("tiny-vit")
    torch.manual_seed(0)
    cfg = ViTConfig(
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=64,
        image_size=32,
        patch_size=8,
    )
    ViTModel(cfg).save_pretrained(path)
    ViTImageProcessor(size={"height": 32, "width": 32}).save_pretrained(path)
    return path
