"""Issue #51: generation time estimates that hold. Once the model is loaded, a short probe at the
request's shape measures this device (:mod:`vfm_core.infer.probe`); the estimate it gives is
logged before sampling, checked against ``--max-minutes`` again, and compared with the time taken
in one line after each video. Timing on shared cores is noisy: the tests ask for 3x, the
benchmark (``benchmarks/generation_estimate.py``) reports the ratios measured."""

from __future__ import annotations

import re
import time

import numpy as np
import pytest
import torch

from tests.infer.conftest import PROMPT
from vfm_core.infer import diffusion_generation, probe
from vfm_core.infer.budget import GenerateBounds
from vfm_core.infer.generate import GenerateRequest, generate
from vfm_core.infer.shapes import GenerateError

pytestmark = pytest.mark.filterwarnings("ignore::vfm_core.infer.shapes.BeyondTrainingWarning")
EMB = np.ones((1, 384), dtype=np.float32) / np.sqrt(384)
AFTER = re.compile(r"generated in ([\d.]+) s \(estimated ([\d.]+) s, ratio ([\d.]+)\)")


def _lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name.startswith("vfm_core.infer")]


def _generate(run, tmp_path, caplog, *, tokenizer=None, **kw):
    caplog.set_level("INFO", logger="vfm_core")
    req = GenerateRequest(prompt=PROMPT, **kw)
    t0 = time.perf_counter()
    res = generate(run, req, tmp_path / "v.mp4", tokenizer=tokenizer, text_emb=EMB)
    return res, time.perf_counter() - t0


@pytest.mark.parametrize(
    "family,kw",
    [
        ("dit", dict(frames=13, height=128, width=128, steps=12)),  # 256 tokens, 23 calls
        ("ar", dict(frames=9, height=64, width=64, guidance=3.0, top_k=16)),  # 192 tokens
    ],
)
def test_the_estimate_of_a_tiny_model_holds(
    family, kw, tiny_run, ar_run, tiny_tokenizer, tmp_path, caplog
):
    """Estimate within 5x of the measured sampling + decoding + writing (the 2x target is the
    benchmark's, which measured 0.5-1.5x on 2 busy shared cores: here a parallel test worker may
    change the load between the probe and the sampling); logged before sampling, compared after,
    in the result. The FLOPs-only estimate was 3-15x off."""
    run, tok = (tiny_run, tiny_tokenizer) if family == "dit" else (ar_run, None)
    res, _ = _generate(run, tmp_path, caplog, tokenizer=tok, **kw)
    measured = res.sample_s + res.decode_s
    seen = (measured, res.estimate_s, res.probe_s, res.sample_s)  # what a failure shows
    assert 1 / 5 < measured / res.estimate_s < 5, seen
    assert 0 < res.probe_s < res.sample_s, seen  # a probe, not a second generation
    lines = _lines(caplog)
    (first,) = [i for i, ln in enumerate(lines) if ln.startswith("estimated ")]
    (after,) = [i for i, ln in enumerate(lines) if AFTER.fullmatch(ln)]
    assert first < after
    got, est, ratio = map(float, AFTER.fullmatch(lines[after]).groups())
    assert got == pytest.approx(measured, rel=0.01, abs=0.01)
    assert est == pytest.approx(res.estimate_s, rel=0.01, abs=0.01)
    assert ratio == pytest.approx(measured / res.estimate_s, abs=0.01)


def test_the_estimate_is_logged_before_sampling(tiny_run, tmp_path, caplog, monkeypatch):
    logged_before = []
    real = diffusion_generation.sample_latent

    def sample_latent(*a, **k):
        logged_before.append(any(ln.startswith("estimated ") for ln in _lines(caplog)))
        return real(*a, **k)

    monkeypatch.setattr(diffusion_generation, "sample_latent", sample_latent)
    _generate(tiny_run, tmp_path, caplog, frames=5, steps=2)
    assert logged_before == [True]
    assert "sampling" in next(ln for ln in _lines(caplog) if ln.startswith("estimated "))


def test_a_request_the_probe_finds_too_slow_is_refused_before_sampling(
    tiny_run, tmp_path, monkeypatch
):
    """The FLOPs estimate passes ``--max-minutes``; a device measured at a minute per model call
    (a fixed time, not a multiple of this machine's: a fast run measured 3 ms, and 1000x of it
    passed the bound) refuses the request in one line before the noise is drawn (``--force``: a
    warning, and it runs)."""
    real = probe.timed

    def slow_device(fn, device):
        _, spent = real(fn, device)
        return 60.0, spent

    def boom(*_a, **_k):
        raise AssertionError("sampled a refused request")

    monkeypatch.setattr(probe, "timed", slow_device)
    monkeypatch.setattr(diffusion_generation, "initial_noise", boom)
    req = GenerateRequest(prompt=PROMPT, frames=5, steps=4, bounds=GenerateBounds(max_minutes=0.5))
    with pytest.raises(GenerateError) as e:
        generate(tiny_run, req, tmp_path / "v.mp4", text_emb=EMB)
    msg = str(e.value)
    assert "\n" not in msg and "measured by a probe of the model at this shape" in msg, msg
    assert "over the bound of 30 s (--max-minutes)" in msg and "lower" in msg and "--steps" in msg


def test_the_probe_times_a_warm_call_and_stays_short(monkeypatch):
    calls = []

    def work(seconds):
        def fn():
            calls.append(seconds)
            time.sleep(seconds)

        return fn

    once, spent = probe.timed(work(0.01), torch.device("cpu"))
    assert len(calls) == 1 + probe.TIMED_CALLS and 0.01 <= once < spent
    calls.clear()
    monkeypatch.setattr(probe, "REPEAT_S", 0.05)  # timed once after the warm-up
    once, spent = probe.timed(work(0.03), torch.device("cpu"))
    assert len(calls) == 2 and 0.03 <= once < spent
    calls.clear()
    monkeypatch.setattr(probe, "WARM_S", 0.05)  # a long call: its warm-up is the measure
    once, spent = probe.timed(work(0.06), torch.device("cpu"))
    assert len(calls) == 1 and once == spent
