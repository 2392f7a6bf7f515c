"""Evaluation: the Fréchet distance against an independent formula, the held-out loss is
deterministic and uses fixed sigmas, evaluate() end to end on a tiny run, metrics in MLflow."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import scipy.linalg
import torch

from vfm_core.checkpoints.load import load_dit
from vfm_core.config import ConfigError, TrackingConfig
from vfm_core.infer.evaluate import (
    EvalConfig,
    evaluate,
    frechet_distance,
    heldout_batches,
    heldout_loss,
    log_evaluation,
)


def _fd_scipy(a, b):
    mu_a, mu_b = a.mean(0), b.mean(0)
    s_a, s_b = np.cov(a, rowvar=False), np.cov(b, rowvar=False)
    covmean = scipy.linalg.sqrtm(s_a @ s_b).real
    return ((mu_a - mu_b) ** 2).sum() + np.trace(s_a + s_b - 2 * covmean)


def test_frechet_distance_matches_reference_formula():
    rng = np.random.default_rng(0)
    a = rng.standard_normal((200, 6))
    b = rng.standard_normal((150, 6)) * 1.5 + 0.3
    assert frechet_distance(a, b) == pytest.approx(_fd_scipy(a, b), rel=1e-6)
    assert abs(frechet_distance(a, a)) < 1e-8
    # a pure mean shift adds |shift|^2
    assert frechet_distance(a, a + 2.0) == pytest.approx(6 * 4.0, rel=1e-6)
    # rank-deficient (fewer samples than dims) stays finite and >= 0
    assert frechet_distance(a[:5], b[:7]) >= 0


def test_frechet_distance_rejects_bad_shapes():
    with pytest.raises(ValueError, match="frechet_distance"):
        frechet_distance(np.zeros((4, 3)), np.zeros((4, 5)))
    with pytest.raises(ValueError, match="frechet_distance"):
        frechet_distance(np.zeros((1, 3)), np.zeros((4, 3)))


def test_heldout_loss_fixed_sigmas_and_deterministic(tiny_run):
    loaded = load_dit(tiny_run)
    ec = EvalConfig(sigmas=(0.1, 1.0), loss_samples=4, batch=2)
    lat, txt, _ = heldout_batches(loaded.cfg, ec, 4)
    a = heldout_loss(loaded.model, loaded.cfg, lat, txt, ec)
    b = heldout_loss(loaded.model, loaded.cfg, lat, txt, ec)
    assert a == b and set(a) == {"loss_sigma_0.1", "loss_sigma_1", "heldout_loss"}
    assert a["heldout_loss"] == pytest.approx((a["loss_sigma_0.1"] + a["loss_sigma_1"]) / 2)
    # held-out data is not the training stream (other data seed)
    train_lat, _, _ = heldout_batches(
        loaded.cfg, EvalConfig(heldout_seed=loaded.cfg.data.seed, batch=2), 4
    )
    assert not np.allclose(lat.numpy(), train_lat.numpy())
    # held-out shards for a run on synthetic data were ignored: synthetic held-out data instead
    with pytest.raises(ConfigError, match="heldout_shards=/data/test: the run trained on data.so"):
        heldout_batches(loaded.cfg, EvalConfig(heldout_shards="/data/test"), 4)


def test_evaluate_end_to_end_logs_to_mlflow(tiny_run, tiny_tokenizer, data_root):
    ec = EvalConfig(sigmas=(0.3, 3.0), loss_samples=4, fd_samples=4, steps=2, batch=4)
    m = evaluate(tiny_run, config=ec)  # latent-preview decoder (the run has no tokenizer)
    assert m["frechet_distance"] > 0 and m["heldout_loss"] > 0 and m["fd_samples"] == 4
    m_tok = evaluate(tiny_run, tokenizer=tiny_tokenizer, config=ec)
    assert m_tok["heldout_loss"] == m["heldout_loss"]  # the loss does not involve the decoder
    # the untrained baseline: the run's initialisation on the same data, noise and decoder
    assert m["untrained_frechet_distance"] > 0 and m["untrained_heldout_loss"] > 0
    assert m["fd_ratio_untrained"] == pytest.approx(
        m["untrained_frechet_distance"] / m["frechet_distance"]
    )
    assert m["loss_reduction"] == pytest.approx(1 - m["heldout_loss"] / m["untrained_heldout_loss"])
    assert m["fd_data_halves"] >= 0  # the data against itself, 2 clips vs 2: the sampling floor
    assert "prompt_colour_acc" not in m  # synthetic latents: no captions to read back
    tracking = TrackingConfig(experiment="test-infer-eval")
    run_id = log_evaluation(m, tracking=tracking, params={"checkpoint": str(tiny_run)})
    import mlflow

    run = mlflow.MlflowClient().get_run(run_id)
    assert run.data.metrics["eval/frechet_distance"] == pytest.approx(m["frechet_distance"])
    assert run.data.params["checkpoint"] == str(tiny_run) and run.info.status == "FINISHED"


def test_first_frame_continuations_keep_the_given_frame(tiny_run, tiny_tokenizer):
    """The evaluation's image-to-video clips: the given first latent frame comes back exactly,
    the rest is generated; evaluate() reports what the pixels of both show."""
    from vfm_core.infer.evaluate import sample_clips

    loaded = load_dit(tiny_run)
    ec = EvalConfig(loss_samples=2, fd_samples=2, steps=2, batch=2, untrained_baseline=False)
    lat, txt, null = heldout_batches(loaded.cfg, ec, 2)  # (2, C, T, H, W)
    first = lat[:, :, :1]
    out = sample_clips(loaded.model, loaded.cfg, ec, txt, null, lat.shape, prompt=first)
    free = sample_clips(loaded.model, loaded.cfg, ec, txt, null, lat.shape)
    assert torch.equal(out[:, :, :1], first) and not torch.equal(free[:, :, :1], first)
    assert not torch.equal(out[:, :, 1:], free[:, :, 1:])  # the rest follows the given frame
    m = evaluate(
        tiny_run, tokenizer=tiny_tokenizer, config=dataclasses.replace(ec, frame_prompts=2)
    )
    assert 0 <= m["frame_colour_kept"] <= 1 and 0 <= m["frame_motion_kept"] <= 1
    assert 0 <= m["frame_n_scored"] <= 2
