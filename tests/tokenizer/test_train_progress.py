"""Tokenizer training says how far it is, also with ``progress=False`` (no bar: what the
pipeline's tokenizer task passes): progress lines with the loss, through logging."""

from __future__ import annotations

import logging

from vfm_core.tokenizer.config import TokenizerConfig
from vfm_core.tokenizer.train import synthetic_clips, train_tokenizer


def test_tokenizer_training_logs_progress(caplog, monkeypatch):
    monkeypatch.setenv("VFM_PROGRESS_EVERY_S", "0")
    caplog.set_level(logging.INFO, logger="vfm_core")
    clips = [synthetic_clips(2, frames=5, size=16, seed=i) for i in range(2)]
    train_tokenizer(TokenizerConfig(), clips, steps=4, progress=False)
    lines = [r.getMessage() for r in caplog.records if r.name == "vfm_core.tokenizer.train"]
    want = [f"tokenizer training: {i}/4 step{'s' * (i > 1)} ({i / 4:.0%})" for i in range(1, 5)]
    got = [ln.split(",")[0] for ln in lines]
    # a handler another test left on a parent logger may deliver a record to caplog twice
    got = [g for i, g in enumerate(got) if i == 0 or g != got[i - 1]]
    # every line one of the steps, in order, the last one at 100% (a slow first step may fall in
    # the quiet start-up delay, so the first lines are not all promised)
    assert got and got[-1] == want[-1] and got == [w for w in want if w in got], got
    assert " step/s, about " in lines[-1] and "loss " in lines[-1]


def test_tokenizer_training_counts_its_flops_and_reports_mfu():
    """The step's FLOPs (counted on the first step) equal a separate count of one forward +
    backward of the same model on the same batch; the speed line gives steps/s, GFLOP/s, MFU."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from vfm_core.perf.hardware import cpu_speed
    from vfm_core.tokenizer.autoencoder import CausalVideoAutoencoder

    cfg = TokenizerConfig()
    clips = [synthetic_clips(2, frames=5, size=16, seed=i) for i in range(2)]
    _, m = train_tokenizer(cfg, clips, steps=3, progress=False)
    model = CausalVideoAutoencoder(cfg).train()
    with FlopCounterMode(display=False) as counter:
        out = model(clips[0], generator=torch.Generator().manual_seed(0))
        (out.recon - clips[0]).abs().mean().backward()
    assert m.flops_per_step == counter.get_total_flops() > 0
    assert abs(m.train_flops_per_s - m.flops_per_step * 3 / m.seconds) < 1e-6 * m.train_flops_per_s
    line, util = cpu_speed(m.steps, m.seconds, m.train_flops_per_s)
    assert 0 < util < 1 and " steps/s, " in line and f"MFU {util:.1%} of this CPU's" in line
