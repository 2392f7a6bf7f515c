"""Peak-FLOP/s table, GPU name lookup, the measured CPU peak and MFU."""

from __future__ import annotations

import time

import pytest
import torch

from vfm_core.perf import hardware
from vfm_core.perf.hardware import (
    PEAKS,
    GpuSpec,
    gpu_peak,
    match_gpu,
    measure_cpu_peak,
    mfu,
    peak_flops,
)


def test_datasheet_table():
    h100, h200, a100, b200 = PEAKS["H100 SXM"], PEAKS["H200"], PEAKS["A100 SXM"], PEAKS["B200"]
    assert gpu_peak(h100, "bfloat16") == 989e12
    assert gpu_peak(h100, "fp8") == 1979e12
    assert (h100.hbm_gb, h100.hbm_tbps, h100.nvlink_gbps, h100.ib_gbps) == (80, 3.35, 900, 400)
    assert h100.gpus_per_node == 8
    # H200 = H100 compute with more, faster HBM
    assert (h200.bf16_tflops, h200.fp8_tflops) == (h100.bf16_tflops, h100.fp8_tflops)
    assert (h200.hbm_gb, h200.hbm_tbps) == (141, 4.8)
    assert (a100.bf16_tflops, a100.fp8_tflops, a100.hbm_tbps, a100.nvlink_gbps) == (
        312,
        None,
        2.039,
        600,
    )
    assert (b200.bf16_tflops, b200.fp8_tflops, b200.nvlink_gbps) == (2250, 4500, 1800)
    assert 180 <= b200.hbm_gb <= 192 and 7.7 <= b200.hbm_tbps <= 8.0
    for key, spec in PEAKS.items():
        assert isinstance(spec, GpuSpec)
        assert "datasheet" in spec.source and "nvidia.com" in spec.source, key
        # dense figures: FP8 is exactly twice BF16, BF16 twice TF32, all far above plain FP32
        if spec.fp8_tflops is not None:
            assert spec.fp8_tflops == pytest.approx(2 * spec.bf16_tflops, rel=0.01)
        assert spec.bf16_tflops == pytest.approx(2 * spec.tf32_tflops, rel=0.03)
        assert spec.fp32_tflops < spec.tf32_tflops
    with pytest.raises(TypeError):
        GpuSpec("x", 1.0)  # kw-only


@pytest.mark.parametrize(
    "name,key",
    [
        ("NVIDIA H100 80GB HBM3", "H100 SXM"),
        ("NVIDIA H100 PCIe", "H100 PCIe"),
        ("NVIDIA H100 NVL", "H100 NVL"),
        ("NVIDIA H200", "H200"),
        ("NVIDIA A100-SXM4-80GB", "A100 SXM"),
        ("NVIDIA B200", "B200"),
        ("NVIDIA GB200", None),  # not a B200: different clocks and peak
        ("Tesla T4", None),
    ],
)
def test_match_gpu(name, key):
    assert match_gpu(name) == key


def test_gpu_dtypes():
    h100 = PEAKS["H100 SXM"]
    assert gpu_peak(h100, "float16") == gpu_peak(h100, "torch.bfloat16") == 989e12
    matmul = torch.backends.cuda.matmul  # a module proxy: monkeypatch.setattr cannot undo on it
    previous = matmul.allow_tf32
    try:
        matmul.allow_tf32 = True
        assert gpu_peak(h100, "float32") == 494.7e12  # fp32 matmuls run on TF32 tensor cores
        matmul.allow_tf32 = False
        assert gpu_peak(h100, "float32") == 67e12
    finally:
        matmul.allow_tf32 = previous
    with pytest.raises(ValueError, match="fp8"):
        gpu_peak(PEAKS["A100 SXM"], "fp8")
    with pytest.raises(ValueError, match="unknown"):
        gpu_peak(h100, "int4")


def test_peak_flops_cuda_by_name(monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H100 80GB HBM3")
    value, source = peak_flops("cuda", dtype="bfloat16", width=4096)
    assert value == 989e12 and "H100 SXM" in source and "datasheet" in source
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA L4")
    value, source = peak_flops("cuda:0", dtype="bfloat16", width=4096)
    assert value == 989e12 and "UNKNOWN GPU" in source and "NVIDIA L4" in source


def test_measure_cpu_peak_is_sane():
    t0 = time.perf_counter()
    value = measure_cpu_peak(128, seconds=0.2)
    assert time.perf_counter() - t0 < 5.0
    assert 1e8 < value < 1e14  # anything outside: a timing or FLOP-count bug
    with pytest.raises(ValueError):
        measure_cpu_peak(0)


def test_measure_cpu_peak_agrees_with_a_manual_timing():
    """The figure is a FLOP/s, not off by the 2 of 2·m·k·n: it is at least what a plain timed loop
    of the same GEMM reaches."""
    width, rows = 256, 2048
    a, b = torch.randn(rows, width), torch.randn(width, width)
    torch.matmul(a, b)
    t0 = time.perf_counter()
    for _ in range(10):
        torch.matmul(a, b)
    manual = 10 * 2 * rows * width * width / (time.perf_counter() - t0)
    measured = measure_cpu_peak(width, seconds=0.2, rows=rows)
    assert measured > 0.3 * manual  # best-of, so normally >= manual; slack for a busy machine
    assert measured < 30 * manual


def test_peak_flops_cpu_is_measured_and_cached(monkeypatch):
    calls = []

    def fast(width, *, dtype=torch.float32, seconds=1.0, **kw):
        calls.append((width, dtype))
        return measure_cpu_peak(width, dtype=dtype, seconds=0.2, **kw)

    monkeypatch.setattr(hardware, "measure_cpu_peak", fast)
    monkeypatch.setattr(hardware, "_cpu_cache", {})
    value, source = peak_flops("cpu", dtype="float32", width=64)
    assert value > 1e8 and "measured" in source and "64" in source
    assert peak_flops("cpu", dtype="float32", width=64) == (value, source)
    assert calls == [(64, torch.float32)]  # cached per (width, threads, dtype)
    peak_flops("cpu", dtype="float32", width=96)
    assert len(calls) == 2
    with pytest.raises(ValueError):
        peak_flops("cpu", dtype="fp8", width=64)


def test_mfu():
    assert mfu(494.5e12, 989e12) == pytest.approx(0.5)
    assert mfu(1e9, (4e9, "measured")) == pytest.approx(0.25)
    with pytest.raises(ValueError):
        mfu(1.0, 0.0)
    with pytest.raises(ValueError):
        mfu(-1.0, 1.0)


def test_recheck_cpu_peak_keeps_the_better_figure_and_says_so(caplog):
    """A start-up peak far below what the model reached (a busy machine) is re-measured."""
    new, source = hardware.recheck_cpu_peak(
        1.0, "measured at start-up", achieved=5.0e9, width=64, dtype="fp32"
    )
    assert new > 1.0 and source.startswith("measured at start-up; re-measured during training")
    assert "CPU MFU above 100%" in caplog.text


def test_mfu_is_never_above_100_percent(caplog):
    """A rate above the peak even after the re-measurement (the GEMM measurement understates
    this machine) raises the peak to that rate, says so once in the log and in the peak's
    source, and the logged MFU reads 100%, not 164%."""
    from tests.tiny_runs import TINY_CPU
    from vfm_core.config import apply_overrides
    from vfm_core.recipes import get_recipe
    from vfm_core.train.trainer import Trainer

    assert hardware.peak_at_least(2.0, "spec", achieved=1.0) == (2.0, "spec")
    trainer = Trainer(apply_overrides(get_recipe("dit-tiny"), [*TINY_CPU, "tracking.mlflow=false"]))
    trainer.step_work = (1e3, 1e9)  # a step of 1 GFLOP per process in 1 s ...
    trainer.peak_rechecked = True  # ... the one re-measurement spent ...
    trainer.peak_flops = 1e9 / 1.644  # ... and the peak still 1.644x too low
    source = trainer.peak_source
    for _ in range(2):
        m = trainer.metrics({"loss": 1.0}, step_time=1.0, data_time=0.0)
        assert m["mfu"] == pytest.approx(1.0)
    assert trainer.peak_source == f"{source}; {hardware.RAISED}"
    assert caplog.text.count("MFU above 100%") == 1
