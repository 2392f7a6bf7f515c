"""Peak throughput of the accelerators we train on, the denominator of MFU.

GPU figures are NVIDIA's datasheet numbers for **dense** math (the datasheets headline the 2:4
structured-sparsity figure, twice the dense one; MFU always uses dense). Sources, per entry in
``GpuSpec.source``:

* H100 SXM / PCIe / NVL: "NVIDIA H100 Tensor Core GPU" datasheet,
  https://www.nvidia.com/en-us/data-center/h100/ (BF16 1,979 / FP8 3,958 TFLOPS *with sparsity*
  for SXM -> 989 / 1,979 dense).
* H200 SXM: "NVIDIA H200 Tensor Core GPU" datasheet, https://www.nvidia.com/en-us/data-center/h200/
  (same Hopper compute as H100 SXM; 141 GB HBM3e at 4.8 TB/s).
* A100 SXM 80GB: "NVIDIA A100 Tensor Core GPU" datasheet,
  https://www.nvidia.com/en-us/data-center/a100/ (BF16 312 dense / 624 sparse; no FP8).
* B200 (HGX B200 8-GPU board): "NVIDIA HGX B200" / "DGX B200" datasheets,
  https://www.nvidia.com/en-us/data-center/hgx/ and https://www.nvidia.com/en-us/data-center/dgx-b200/
  (HGX B200: 72 PFLOPS FP8 and 36 PFLOPS BF16 *sparse* for 8 GPUs -> 4.5 / 2.25 PFLOPS dense
  per GPU; per-GPU column: 180 GB HBM3e at 7.7 TB/s — the bare B200 package is quoted at 192 GB and
  8 TB/s; fifth-generation NVLink 1.8 TB/s).

Interconnect: ``nvlink_gbps`` is the total NVLink bandwidth per GPU in GB/s (bidirectional, as the
datasheets state it); ``ib_gbps`` the scale-out NIC per GPU in Gb/s (DGX systems: one ConnectX NIC
per GPU — ConnectX-7 400 Gb/s for DGX H100/H200/B200, ConnectX-6 200 Gb/s for DGX A100).

CPU has no datasheet peak that means anything for PyTorch, so the CPU "peak" is *measured*: the
best achieved FLOP/s of a GEMM of the model's width with the current thread count
(:func:`measure_cpu_peak`). CPU MFU is therefore "fraction of what this CPU's BLAS reaches on a
GEMM of this width", not of a theoretical FMA-unit peak.
"""

from __future__ import annotations

import logging
import re
import time
from dataclasses import dataclass

import torch


@dataclass(kw_only=True, slots=True, frozen=True)
class GpuSpec:
    """Datasheet figures of one GPU (dense math, per GPU)."""

    name: str
    bf16_tflops: float
    """Dense BF16/FP16 tensor-core TFLOPS."""
    fp8_tflops: float | None
    """Dense FP8 tensor-core TFLOPS (None: no FP8 tensor cores)."""
    tf32_tflops: float
    """Dense TF32 tensor-core TFLOPS (fp32 matmuls with ``allow_tf32``)."""
    fp32_tflops: float
    """Non-tensor-core FP32 TFLOPS (fp32 matmuls without TF32)."""
    hbm_gb: float
    """HBM capacity, GB."""
    hbm_tbps: float
    """HBM bandwidth, TB/s."""
    nvlink_gbps: float
    """NVLink bandwidth per GPU, GB/s (total, bidirectional)."""
    ib_gbps: float
    """Scale-out network per GPU, Gb/s (one InfiniBand/RoCE NIC per GPU in DGX/HGX nodes)."""
    gpus_per_node: int
    source: str
    """Where the figures come from (datasheet name and URL)."""


_H100_DS = "NVIDIA H100 Tensor Core GPU datasheet, https://www.nvidia.com/en-us/data-center/h100/"

PEAKS: dict[str, GpuSpec] = {
    "H100 SXM": GpuSpec(
        name="H100 SXM",
        bf16_tflops=989.0,
        fp8_tflops=1979.0,
        tf32_tflops=494.7,
        fp32_tflops=67.0,
        hbm_gb=80,
        hbm_tbps=3.35,
        nvlink_gbps=900,
        ib_gbps=400,
        gpus_per_node=8,
        source=_H100_DS + " (SXM column, dense = sparse/2); DGX H100 datasheet",
    ),
    "H100 PCIe": GpuSpec(
        name="H100 PCIe",
        bf16_tflops=756.0,
        fp8_tflops=1513.0,
        tf32_tflops=378.0,
        fp32_tflops=51.0,
        hbm_gb=80,
        hbm_tbps=2.0,
        nvlink_gbps=600,
        ib_gbps=400,
        gpus_per_node=8,
        source=_H100_DS + " (PCIe column, dense = sparse/2)",
    ),
    "H100 NVL": GpuSpec(
        name="H100 NVL",
        bf16_tflops=835.5,
        fp8_tflops=1670.5,
        tf32_tflops=417.5,
        fp32_tflops=60.0,
        hbm_gb=94,
        hbm_tbps=3.9,
        nvlink_gbps=600,
        ib_gbps=400,
        gpus_per_node=8,
        source=_H100_DS + " (H100 NVL column, dense = sparse/2)",
    ),
    "H200": GpuSpec(
        name="H200",
        bf16_tflops=989.0,
        fp8_tflops=1979.0,
        tf32_tflops=494.7,
        fp32_tflops=67.0,
        hbm_gb=141,
        hbm_tbps=4.8,
        nvlink_gbps=900,
        ib_gbps=400,
        gpus_per_node=8,
        source="NVIDIA H200 Tensor Core GPU datasheet (SXM column, dense = sparse/2), "
        "https://www.nvidia.com/en-us/data-center/h200/; DGX H200 datasheet",
    ),
    "A100 SXM": GpuSpec(
        name="A100 SXM 80GB",
        bf16_tflops=312.0,
        fp8_tflops=None,
        tf32_tflops=156.0,
        fp32_tflops=19.5,
        hbm_gb=80,
        hbm_tbps=2.039,
        nvlink_gbps=600,
        ib_gbps=200,
        gpus_per_node=8,
        source="NVIDIA A100 Tensor Core GPU datasheet (A100 80GB SXM column), "
        "https://www.nvidia.com/en-us/data-center/a100/; DGX A100 datasheet (ConnectX-6 200 Gb/s)",
    ),
    "B200": GpuSpec(
        name="B200",
        bf16_tflops=2250.0,
        fp8_tflops=4500.0,
        tf32_tflops=1100.0,
        fp32_tflops=75.0,
        hbm_gb=180,
        hbm_tbps=7.7,
        nvlink_gbps=1800,
        ib_gbps=400,
        gpus_per_node=8,
        source="NVIDIA HGX B200 datasheet (8-GPU board totals / 8, dense = sparse/2), "
        "https://www.nvidia.com/en-us/data-center/hgx/; DGX B200 datasheet "
        "(HGX/DGX B200 per GPU: 180 GB at 7.7 TB/s; the bare B200 package: 192 GB at 8 TB/s)",
    ),
}

# torch.cuda.get_device_name() strings -> table key, first match wins (e.g. "NVIDIA H100 80GB
# HBM3" is the SXM part, "NVIDIA A100-SXM4-80GB", "NVIDIA B200"; "GB200" deliberately does not
# match B200: its clocks and peak differ).
_NAME_PATTERNS: tuple[tuple[str, str], ...] = (
    (r"H100.*PCIe", "H100 PCIe"),
    (r"H100.*NVL", "H100 NVL"),
    (r"H100", "H100 SXM"),
    (r"H200", "H200"),
    (r"A100", "A100 SXM"),  # all A100 variants share the 312 TFLOPS BF16 peak
    (r"(?<![A-Za-z])B200", "B200"),
)
FALLBACK_GPU = "H100 SXM"

_DTYPES = {
    "bfloat16": "bf16",
    "bf16": "bf16",
    "float16": "bf16",
    "fp16": "bf16",
    "half": "bf16",
    "float8": "fp8",
    "fp8": "fp8",
    "float8_e4m3fn": "fp8",
    "float8_e5m2": "fp8",
    "float32": "fp32",
    "fp32": "fp32",
    "float": "fp32",
    "tf32": "tf32",
}


def match_gpu(device_name: str) -> str | None:
    """Key of :data:`PEAKS` for a ``torch.cuda.get_device_name()`` string, None if unknown."""
    for pattern, key in _NAME_PATTERNS:
        if re.search(pattern, device_name, flags=re.IGNORECASE):
            return key
    return None


def _dtype_key(dtype: str) -> str:
    try:
        return _DTYPES[dtype.removeprefix("torch.").lower()]
    except KeyError:
        raise ValueError(f"dtype {dtype!r} unknown (choose from {sorted(_DTYPES)})") from None


def gpu_peak(spec: GpuSpec, dtype: str) -> float:
    """Dense peak FLOP/s of ``spec`` for matmuls in ``dtype``. float32 means TF32 tensor cores when
    ``torch.backends.cuda.matmul.allow_tf32`` is on (what the matmuls then use), plain FP32 else."""
    key = _dtype_key(dtype)
    if key == "fp32" and torch.backends.cuda.matmul.allow_tf32:
        key = "tf32"
    tflops = {
        "bf16": spec.bf16_tflops,
        "fp8": spec.fp8_tflops,
        "tf32": spec.tf32_tflops,
        "fp32": spec.fp32_tflops,
    }[key]
    if tflops is None:
        raise ValueError(f"{spec.name} has no {key} tensor cores")
    return tflops * 1e12


def default_gemm_rows(width: int) -> int:
    """Rows of the CPU peak GEMM: at least 2048 so per-call overhead does not dominate."""
    return max(width, 2048)


log = logging.getLogger(__name__)
_TORCH_DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32, "tf32": torch.float32}


def measure_cpu_peak(
    width: int,
    *,
    dtype: torch.dtype = torch.float32,
    seconds: float = 1.0,
    rows: int | None = None,
    repeats: int = 5,
) -> float:
    """Achieved FLOP/s of a timed GEMM ``(rows × width) @ (width × width)`` on this CPU.

    ``rows`` defaults to ``max(width, 2048)``: the shape of a transformer linear on a batch of
    tokens, with enough rows that per-call overhead does not dominate at small widths (a bare
    64×64 product would understate what the model's own (B·N × 64) GEMMs reach and push CPU MFU
    above 1). Uses the current ``torch.get_num_threads()``. Two warm-up calls, then ``repeats``
    timed rounds of back-to-back calls, each about ``seconds / repeats`` long; returns the best
    round's 2·rows·width·width / elapsed.
    """
    if width <= 0:
        raise ValueError(f"width must be positive, got {width}")
    rows = rows or default_gemm_rows(width)
    a = torch.randn(rows, width, dtype=dtype)
    b = torch.randn(width, width, dtype=dtype)
    out = torch.empty(rows, width, dtype=dtype)
    flops = 2.0 * rows * width * width
    with torch.inference_mode():
        for _ in range(2):  # warm-up: thread pool start, BLAS kernel selection, page faults
            torch.matmul(a, b, out=out)
        t0 = time.perf_counter()
        torch.matmul(a, b, out=out)
        one = max(time.perf_counter() - t0, 1e-7)
        calls = max(1, int(max(seconds, 1e-3) / max(repeats, 1) / one))
        best = float("inf")
        for _ in range(max(repeats, 1)):
            t0 = time.perf_counter()
            for _ in range(calls):
                torch.matmul(a, b, out=out)
            best = min(best, (time.perf_counter() - t0) / calls)
    return flops / best


_cpu_cache: dict[tuple[int, int, str], tuple[float, str]] = {}


def peak_flops(device: str, *, dtype: str, width: int) -> tuple[float, str]:
    """(peak FLOP/s, where the number comes from) for MFU on ``device``.

    * ``cuda[:i]``: the datasheet dense peak (:data:`PEAKS`) of the GPU named by
      ``torch.cuda.get_device_name``; an unknown name falls back to H100 SXM and says so.
    * ``cpu``: :func:`measure_cpu_peak` at ``width`` (the model's hidden size), measured once per
      (width, thread count, dtype) and cached.
    """
    kind = torch.device(device).type
    key = _dtype_key(dtype)
    if kind == "cuda":
        name = torch.cuda.get_device_name(torch.device(device))
        table_key = match_gpu(name)
        if table_key is None:
            spec = PEAKS[FALLBACK_GPU]
            return gpu_peak(spec, dtype), (
                f"UNKNOWN GPU {name!r}: not in vfm_core.perf.hardware.PEAKS, assuming "
                f"{spec.name} datasheet peak ({spec.source}); MFU is only indicative"
            )
        spec = PEAKS[table_key]
        return gpu_peak(spec, dtype), f"{spec.name} datasheet dense {key} ({name}): {spec.source}"
    if kind == "cpu":
        if key not in _TORCH_DTYPES:
            raise ValueError(f"no CPU GEMM for dtype {dtype!r}")
        threads = torch.get_num_threads()
        cache_key = (width, threads, key)
        if cache_key not in _cpu_cache:
            value = measure_cpu_peak(width, dtype=_TORCH_DTYPES[key])
            rows = default_gemm_rows(width)
            _cpu_cache[cache_key] = (
                value,
                f"measured: best {rows}x{width} @ {width}x{width} {_TORCH_DTYPES[key]} GEMM on "
                f"CPU with {threads} threads (vfm_core.perf.hardware.measure_cpu_peak)",
            )
        return _cpu_cache[cache_key]
    raise ValueError(f"no peak FLOP/s known for device {device!r}")


def mfu(achieved_flops_per_s: float, peak: float | tuple[float, str]) -> float:
    """Model FLOPs utilisation: achieved model FLOP/s (from :mod:`vfm_core.perf.flops`) / peak.
    ``peak`` is FLOP/s or the (FLOP/s, source) pair :func:`peak_flops` returns."""
    value = peak[0] if isinstance(peak, tuple) else float(peak)
    if value <= 0:
        raise ValueError(f"peak FLOP/s must be positive, got {value}")
    if achieved_flops_per_s < 0:
        raise ValueError(f"achieved FLOP/s must be >= 0, got {achieved_flops_per_s}")
    return achieved_flops_per_s / value


# ---------------------------------------------------------------------------------------------
# Efficiency constants of the performance planner (vfm_core.perf.timing / planner), in one place.
# Each is a fraction of a datasheet figure above, or a fixed cost, with where the number comes from.
# They are starting points: ``vfm_core.perf.planner.calibrate`` fits them to measured runs.


@dataclass(kw_only=True, slots=True, frozen=True)
class Efficiency:
    """Achieved fractions of datasheet peaks and fixed costs used by the step-time model."""

    gemm: float = 0.75
    """Large bf16 GEMMs reach ~75% of the dense tensor-core peak on H100 SXM (cuBLAS ~740 of 989
    TFLOP/s at 8192³; NVIDIA "Hopper tuning guide" / public cuBLAS benchmarks, e.g. the
    torch ``benchmarks/`` matmul sweeps); A100 likewise ~0.75-0.8 of 312."""
    gemm_launch_s: float = 4e-6
    """Fixed cost per GEMM call (kernel launch, tile-quantisation tail): makes efficiency size-
    dependent, f / (f + gemm·peak·launch) — half-efficiency at ~3 GFLOP on H100."""
    attention: float = 0.55
    """FlashAttention-class kernel, forward + backward, head dim 128, long sequences: FA3 reaches
    ~600-750 TFLOP/s forward and ~450-550 backward in bf16 on H100 (Shah et al. 2024,
    FlashAttention-3, figs. 5-7) -> ~0.55 of 989 over a training step."""
    attention_hd64: float = 0.75
    """Relative throughput at head dim 64 vs 128 (FA2/FA3 papers: hd64 runs ~25-35% slower)."""
    attention_half_seq: int = 512
    """Sequence length at which flash attention runs at half its long-sequence throughput (too few
    query tiles per head to fill 132 SMs; FA2 paper, Dao 2023, fig. 4: 512 -> ~half of 16k)."""
    hbm: float = 0.8
    """Memory-bound element-wise kernels (norms, modulation, activations, RoPE, copies) reach ~80%
    of the HBM datasheet bandwidth (STREAM-like copy on H100: ~2.6-2.9 of 3.35 TB/s)."""
    pointwise_passes: float = 6.0
    """Bytes moved by element-wise work per saved activation byte over forward + backward (each
    saved tensor written once and read once forward, read and gradient written/read backward)."""
    nvlink: float = 0.8
    """NCCL bus bandwidth over NVLink ~360 of 450 GB/s per direction on DGX H100 (nccl-tests
    all_reduce/all_gather busbw at >=1 GB messages; NVIDIA NCCL performance notes)."""
    ib: float = 0.8
    """NCCL bus bandwidth over 400 Gb/s NDR InfiniBand ~40 of 50 GB/s per GPU (nccl-tests across
    DGX H100 nodes, one NIC per GPU)."""
    collective_latency_s: float = 2e-5
    """Fixed latency per collective call (NCCL ring start-up, ~10-30 µs at small sizes)."""
    tp_overlap: float = 0.0
    """Fraction of TP/SP collectives hidden behind GEMMs (0: plain torch TP; async-TP / TE
    userbuffers overlap raises it)."""
    fsdp_overlap: float = 0.9
    """Fraction of the compute time that can hide FSDP all-gathers / reduce-scatters and the DP
    all-reduce (FSDP2 prefetching: the next layer's all-gather runs under the current layer)."""
    comm_contention: float = 0.24
    """Fraction of compute throughput lost while a collective runs *behind* it: NCCL's ring
    kernels occupy up to 32 of the 132 H100 SMs (``NCCL_MAX_NCHANNELS``, one CTA per channel on
    NVLink/IB) and share HBM bandwidth, so "hidden" communication still costs 32/132 ≈ 0.24 of its
    duration in slower GEMMs / attention (NCCL docs, env ``NCCL_MIN/MAX_NCHANNELS``; the SM
    contention torchtitan's async-TP and TE userbuffers work around)."""
    ring_overlap: float = 0.9
    """Fraction of a ring-attention step's compute that hides the next K/V chunk's P2P transfer
    (Liu et al. 2023, Ring Attention, §3: fully hidden when block compute >= transfer time)."""


DEFAULT_EFFICIENCY = Efficiency()

HARDWARE_ALIASES: dict[str, str] = {
    "h100": "H100 SXM",
    "h100-sxm": "H100 SXM",
    "h100-pcie": "H100 PCIe",
    "h100-nvl": "H100 NVL",
    "h200": "H200",
    "a100": "A100 SXM",
    "b200": "B200",
}


def gpu_spec(name: str) -> GpuSpec:
    """GpuSpec for a short name (h100, h200, a100, b200; case-insensitive) or a :data:`PEAKS` key;
    ValueError listing the known names otherwise."""
    key = HARDWARE_ALIASES.get(name.strip().lower())
    if key is None:
        key = next((k for k in PEAKS if k.lower() == name.strip().lower()), None)
    if key is None:
        raise ValueError(
            f"unknown hardware {name!r} (known: {', '.join(sorted(HARDWARE_ALIASES))})"
        )
    return PEAKS[key]


def recheck_cpu_peak(
    peak: float, source: str, *, achieved: float, width: int, dtype: str
) -> tuple[float, str]:
    """The model reached ``achieved`` FLOP/s, above the CPU GEMM ``peak`` measured at start-up:
    that measurement met a busy machine. Measure again and keep the better figure; returns
    (peak, source with the re-measurement noted) and logs a warning."""
    new = max(peak, measure_cpu_peak(width, dtype=_TORCH_DTYPES[_dtype_key(dtype)], seconds=2.0))
    log.warning(
        "CPU MFU above 100%%: the model reached %.1f GFLOP/s but the GEMM peak measured at "
        "start-up was %.1f (the machine was busy then); re-measured: %.1f GFLOP/s",
        achieved / 1e9,
        peak / 1e9,
        new / 1e9,
    )
    note = f"re-measured during training ({peak / 1e9:.1f} -> {new / 1e9:.1f} GFLOP/s)"
    return new, f"{source}; {note}"


RAISED = "raised to the rate the model reached"


def peak_at_least(peak: float, source: str, *, achieved: float) -> tuple[float, str]:
    """MFU is never shown above 100%: a model that reached ``achieved`` FLOP/s above ``peak``
    (on a CPU after its one re-measurement, :func:`recheck_cpu_peak`) shows the peak understated
    for this machine. Returns (``achieved``, the source marked ":data:`RAISED`" — a warning the
    first time) when it is above ``peak``, else ``peak`` and ``source`` unchanged."""
    if achieved <= peak:
        return peak, source
    if RAISED not in source:
        log.warning(
            "MFU above 100%%: the model reached %.1f GFLOP/s, above the peak of %.1f (%s); the "
            "peak is raised to the rate reached, so MFU reads 100%% at most",
            achieved / 1e9,
            peak / 1e9,
            source,
        )
        source = f"{source}; {RAISED}"
    return achieved, source


CONV_PEAK_WIDTH = 512
"""Width of the GEMM whose measured speed stands for a CPU's peak in a convolutional model's MFU
(the video tokenizer's: its convolutions run as GEMMs of a few hundred columns)."""


def cpu_speed(steps: int, seconds: float, flops_per_s: float) -> tuple[str, float]:
    """(one line: steps/s, GFLOP/s and MFU against this CPU's measured fp32 peak, the MFU) of a
    training loop on the CPU that ran ``steps`` in ``seconds`` at ``flops_per_s``."""
    peak = peak_flops("cpu", dtype="fp32", width=CONV_PEAK_WIDTH)
    util = mfu(flops_per_s, peak) if flops_per_s > 0 else 0.0
    rate = steps / max(seconds, 1e-9)
    line = (
        f"{rate:.2f} steps/s, {flops_per_s / 1e9:.1f} GFLOP/s, MFU {util:.1%} of this CPU's "
        f"measured fp32 peak ({peak[0] / 1e9:.0f} GFLOP/s, {torch.get_num_threads()} threads)"
    )
    return line, util
