"""A damaged tokenizer file is reported in one line naming the file and the problem (issue #17):
truncated, cut inside its header, or with a header that is not JSON."""

from __future__ import annotations

import pytest
import torch

from vfm_core.tokenizer import TokenizerLoadError, load_tokenizer
from vfm_core.tokenizer.autoencoder import CausalVideoAutoencoder
from vfm_core.tokenizer.config import TokenizerConfig
from vfm_core.tokenizer.io import save_tokenizer


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    torch.manual_seed(0)
    model = CausalVideoAutoencoder(TokenizerConfig(base_channels=16, norm_groups=8))
    return save_tokenizer(model, tmp_path_factory.mktemp("tok"))


def _damaged(saved, tmp_path, keep: int | None = None, flip_header: bool = False):
    raw = bytearray(saved.read_bytes())
    if flip_header:
        raw[9] = 0xFF  # inside the JSON header
    out = tmp_path / "tokenizer.safetensors"
    out.write_bytes(bytes(raw[:keep] if keep is not None else raw))
    return out, len(raw)


def test_truncated_tokenizer_is_reported_clearly(saved, tmp_path):
    out, size = _damaged(saved, tmp_path, keep=saved.stat().st_size // 2)
    with pytest.raises(
        TokenizerLoadError,
        match=rf"^cannot read safetensors file {out}: "
        rf"truncated: {size // 2} bytes, its header describes {size}$",
    ):
        load_tokenizer(tmp_path)


def test_tokenizer_cut_inside_its_header_or_with_a_bad_header(saved, tmp_path):
    out, _ = _damaged(saved, tmp_path, keep=100)
    with pytest.raises(TokenizerLoadError, match=r"truncated: 100 bytes, the header alone needs"):
        load_tokenizer(out)
    out, _ = _damaged(saved, tmp_path, flip_header=True)
    with pytest.raises(TokenizerLoadError, match=r"header is not valid JSON"):
        load_tokenizer(out)
