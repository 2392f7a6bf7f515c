"""vfm generate on an autoregressive run: an ar-tiny checkpoint trained on the default synthetic
source writes a video and its token ids without further flags; greedy sampling is reproducible;
tokenizers that do not fit the vocabulary and --nproc > 1 are refused in one line."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from vfm_core.checkpoints.load import load_dit
from vfm_core.config import apply_overrides
from vfm_core.infer.generate import GenerateRequest, generate
from vfm_core.infer.shapes import GenerateError
from vfm_core.recipes import get_recipe
from vfm_core.tokenizer import TokenizerConfig, save_tokenizer
from vfm_core.tokenizer.autoencoder import CausalVideoAutoencoder
from vfm_core.train.main import run_training

EMB = np.ones((1, 384), dtype=np.float32) / np.sqrt(384)


@pytest.fixture(scope="module")
def ar_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("ar-run")
    small = ["model.depth=2", "train.steps=4", "data.batch_size=2", "tracking.mlflow=false"]
    cfg = apply_overrides(get_recipe("ar-tiny"), small)
    run_training(cfg, out_dir=out, progress=False)
    return out


def test_generates_video_and_tokens_without_flags(ar_run, tmp_path):
    req = GenerateRequest(
        prompt="a red disc moving right", frames=9, height=64, width=64, temperature=0.0
    )
    a = generate(ar_run, req, tmp_path / "a.mp4", text_emb=EMB)
    generate(ar_run, req, tmp_path / "b.mp4", text_emb=EMB)
    assert a.decoder == "latent-preview" and a.latent_shape == (4, 3, 8, 8)
    assert a.steps == 192  # one model call per token of the 3 x 8 x 8 grid
    ta, tb = np.load(tmp_path / "a.tokens.npy"), np.load(tmp_path / "b.tokens.npy")
    assert ta.shape == (3, 8, 8) and ta.dtype == np.int32
    assert np.array_equal(ta, tb)  # greedy: the same video
    assert (tmp_path / "a.mp4").stat().st_size > 0


def test_tokenizers_that_do_not_fit_are_refused(ar_run, tmp_path):
    req = GenerateRequest(prompt="x", frames=9, height=64, width=64)
    cont = save_tokenizer(CausalVideoAutoencoder(TokenizerConfig()), tmp_path / "cont")
    with pytest.raises(GenerateError, match="continuous tokenizer"):
        generate(ar_run, req, tmp_path / "c.mp4", tokenizer=cont.parent, text_emb=EMB)
    other = save_tokenizer(
        CausalVideoAutoencoder(TokenizerConfig(fsq_levels=(5, 5, 5, 5))), tmp_path / "other"
    )
    with pytest.raises(GenerateError, match="625 ids"):
        generate(ar_run, req, tmp_path / "o.mp4", tokenizer=other.parent, text_emb=EMB)
    with pytest.raises(GenerateError, match=r"--top-p 0.0: must be a number in \(0, 1\]"):
        generate(
            ar_run,
            GenerateRequest(prompt="x", frames=9, top_p=0.0),
            tmp_path / "p.mp4",
            text_emb=EMB,
        )
    # --steps sets a diffusion sampler: refused here as --temperature is for a DiT run
    with pytest.raises(
        GenerateError,
        match=r"^--steps: denoising steps of diffusion runs; this run's model.arch is 'ar' \(its "
        "sampler draws one token per latent position",
    ):
        generate(ar_run, GenerateRequest(prompt="x", frames=9, steps=4), tmp_path / "s.mp4")


def test_evaluate_autoregressive_run(ar_run, tmp_path):
    """One evaluation for both families: bits per token in place of the EDM loss, and the same
    Fréchet distance and untrained baseline of clips sampled token by token, decoded by a
    discrete tokenizer of the model's vocabulary (or the FSQ-code preview without one)."""
    from vfm_core.infer.evaluate import EvalConfig, evaluate

    ec = EvalConfig(loss_samples=4, fd_samples=4, batch=4, temperature=0.0)
    m = evaluate(ar_run, config=ec)  # no tokenizer: the codes' latent preview
    assert 0 < m["heldout_bits_per_token"] and m["uniform_bits_per_token"] == pytest.approx(
        np.log2(256)  # ar-tiny's 256 ids
    )
    assert m["frechet_distance"] > 0 and m["fd_samples"] == 4 and m["fd_data_halves"] >= 0
    assert m["untrained_heldout_loss"] > 0 and m["untrained_frechet_distance"] > 0
    assert m["loss_reduction"] == pytest.approx(1 - m["heldout_loss"] / m["untrained_heldout_loss"])
    assert m["fd_ratio_untrained"] == pytest.approx(
        m["untrained_frechet_distance"] / m["frechet_distance"]
    )
    torch.manual_seed(0)
    tok = save_tokenizer(
        CausalVideoAutoencoder(TokenizerConfig(base_channels=8, fsq_levels=(4, 4, 4, 4))),
        tmp_path / "tok",
    ).parent
    m_tok = evaluate(ar_run, tokenizer=tok, config=ec)
    assert m_tok["heldout_loss"] == m["heldout_loss"]  # the loss does not involve the decoder
    assert m_tok["frechet_distance"] != m["frechet_distance"]  # decoded by the tokenizer


def test_autoregressive_evaluation_continues_given_first_frames(ar_run):
    """The evaluation's first-frame clips for token ids: the first latent frame's tokens are
    kept in raster order and the rest drawn after them."""
    from vfm_core.infer.evaluate import EvalConfig, heldout_batches, sample_clips

    loaded = load_dit(ar_run)
    ec = EvalConfig(loss_samples=2, fd_samples=2, batch=2, temperature=0.0)
    ids, txt, null = heldout_batches(loaded.cfg, ec, 2)  # (2, T, H, W)
    out = sample_clips(loaded.model, loaded.cfg, ec, txt, null, ids.shape, prompt=ids[:, :1])
    assert out.shape == ids.shape and torch.equal(out[:, :1], ids[:, :1])
