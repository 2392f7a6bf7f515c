"""What this device offers a generation: the FLOP/s the cost estimate assumes
(:func:`device_rate`) and the memory a request may still take (:func:`available_memory`)."""

from __future__ import annotations

import os
from pathlib import Path

import torch

__all__ = ["EFFICIENCY", "available_memory", "device_rate"]

EFFICIENCY = {"cpu": 1.0, "cuda": 0.3}
"""Fraction of the device's FLOP/s a generation reaches: CPU of the GEMM rate measured at width
max(hidden, 512) (2 idle cores: dit-tiny sampling 16,384 tokens 1.7x it, attention-bound; the
tokenizer's decoder 1.2-1.4x), CUDA of the datasheet peak."""

_CPU_RATES: dict[tuple[int, int], float] = {}


def device_rate(
    device: torch.device | str, *, width: int, tflops: float | None = None
) -> tuple[float, str]:
    """(FLOP/s a generation reaches on ``device``, where the number comes from): ``tflops`` when
    stated, else :data:`EFFICIENCY` times the CPU's GEMM rate at width max(``width``, 512)
    (measured once per width and thread count, ~0.3 s; narrower GEMMs time their call overhead)
    or the GPU's datasheet peak."""
    if tflops is not None:
        return tflops * 1e12, "--device-tflops"
    dev = torch.device(device)
    if dev.type == "cuda":
        from vfm_core.perf.hardware import peak_flops

        peak, source = peak_flops(str(dev), dtype="fp32", width=width)
        eff = EFFICIENCY["cuda"]
        return peak * eff, f"{eff:.0%} of the {source.split(':')[0]} peak"
    from vfm_core.perf.hardware import measure_cpu_peak

    key = (max(width, 512), torch.get_num_threads())
    if key not in _CPU_RATES:
        _CPU_RATES[key] = measure_cpu_peak(key[0], seconds=0.25, repeats=3)
    eff = EFFICIENCY["cpu"]
    share = "" if eff == 1 else f"{eff:.0%} of "
    return eff * _CPU_RATES[key], f"{share}this CPU's measured GEMM rate, {key[1]} threads"


def _cgroup_room() -> float | None:
    """Bytes this process's cgroup may still allocate (v2 or v1), None without a limit."""
    for limit, usage in (
        ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
        (
            "/sys/fs/cgroup/memory/memory.limit_in_bytes",
            "/sys/fs/cgroup/memory/memory.usage_in_bytes",
        ),
    ):
        try:
            lim = Path(limit).read_text().strip()
            if lim == "max" or int(lim) >= 2**60:
                continue
            return max(0.0, float(int(lim) - int(Path(usage).read_text())))
        except (OSError, ValueError):
            continue
    return None


def available_memory(device: torch.device | str = "cpu") -> float:
    """Bytes that can still be allocated on ``device``: free GPU memory, or the host's
    MemAvailable (capped by a cgroup limit)."""
    dev = torch.device(device)
    if dev.type == "cuda":
        return float(torch.cuda.mem_get_info(dev)[0])
    avail = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                avail = float(line.split()[1]) * 1024
    except OSError:
        pass
    if avail is None:
        avail = float(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    room = _cgroup_room()
    return avail if room is None else min(avail, room)
