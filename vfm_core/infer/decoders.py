"""The run's tokenizer loaded as the decoder of generated latents or token ids: a continuous one
with the DiT's latent channels (:func:`load_decoder`), or a discrete one whose FSQ grid is the
autoregressive model's vocabulary (:func:`load_token_decoder`). Every mismatch is one
:class:`~vfm_core.infer.shapes.GenerateError` naming ``--tokenizer``."""

from __future__ import annotations

from pathlib import Path

from vfm_core.infer.shapes import GenerateError

__all__ = ["load_decoder", "load_token_decoder"]


def load_decoder(path: str | Path, *, latent_channels: int):
    """The tokenizer at ``path`` (vfm or external layout); channel mismatch -> GenerateError."""
    from vfm_core.tokenizer import TokenizerLoadError, load_external_tokenizer, load_tokenizer
    from vfm_core.tokenizer.io import WEIGHTS_FILE

    p = Path(path)
    try:
        if (p / WEIGHTS_FILE).is_file() or p.is_file():
            return load_tokenizer(p, expected_latent_channels=latent_channels)
        return load_external_tokenizer(p, expected_latent_channels=latent_channels)
    except TokenizerLoadError as e:
        raise GenerateError(f"--tokenizer {p}: {e}") from None


def load_token_decoder(path: str | Path, *, vocab_size: int):
    """A discrete tokenizer whose FSQ grid has ``vocab_size`` ids, else GenerateError."""
    from vfm_core.tokenizer import TokenizerLoadError, load_tokenizer

    try:
        tok = load_tokenizer(path)
    except TokenizerLoadError as e:
        raise GenerateError(f"--tokenizer {path}: {e}") from None
    if tok.fsq is None:
        raise GenerateError(
            f"--tokenizer {path}: a continuous tokenizer; the autoregressive model needs a "
            "discrete one (vfm tokenizer train --discrete)"
        )
    if tok.vocab_size != vocab_size:
        raise GenerateError(
            f"--tokenizer {path}: its codebook has {tok.vocab_size} ids (FSQ levels "
            f"{list(tok.cfg.fsq_levels)}), the model's vocabulary {vocab_size}"
        )
    return tok
