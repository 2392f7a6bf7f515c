"""Time estimates that hold: the FLOPs estimate of :mod:`vfm_core.infer.budget` scaled by what a
short probe of the real model measures on this device at the request's shape.

The FLOPs estimate assumes the device's GEMM rate, which a sampler call of a small model does not
reach (per-call overhead, attention, threads that wait on shared cores): the demo's videos took
3.5x their estimate on 2 idle CPU cores, 19x in a loaded pipeline. So once the weights are
loaded, before sampling, :func:`calibrate` times on this device:

* **sampling**: one steady model call at the request's shape and batch
  (:meth:`vfm_core.infer.generation.Generation.probe_call`: a denoiser call of the DiT, with
  guidance's two rows; one cached token step of the AR model half-way through the video, with
  its draw);
* **decoding**: the tokenizer's decoder on one latent frame at the request's size;

each after one warm-up call (:func:`timed`: the median of up to :data:`TIMED_CALLS` calls while
the probe of the phase has spent under :data:`REPEAT_S`; a warm-up of :data:`WARM_S` or more is
the measure itself, its one-off costs small beside it). Each phase's estimate is then scaled by
measured / modelled seconds of the same work; writing keeps its per-pixel rate
(:data:`vfm_core.infer.budget.WRITE_S_PER_PIXEL`). The probe costs 4 model calls of a few ms, 2
of 0.1-1 s, 1 of a large request, and as many decodes of one latent frame.

Context-parallel ranks each probe the whole sequence, without collectives, and agree on the
slowest rank's measures (one all-reduce), so every rank checks the same estimate; the ring's
communication is not measured.

:func:`estimate_line` is what ``vfm generate`` logs before sampling, :func:`after_line` the
comparison after it: ``generated in X s (estimated Y s, ratio Z)``.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from vfm_core.infer.budget import CostEstimate, decoder_flops
from vfm_core.infer.shapes import LatentPlan
from vfm_core.progress import format_duration

if TYPE_CHECKING:
    from vfm_core.checkpoints.load import LoadedDiT
    from vfm_core.infer.generation import Generation
    from vfm_core.infer.request import GenerateRequest

__all__ = [
    "REPEAT_S",
    "TIMED_CALLS",
    "WARM_S",
    "Calibration",
    "after_line",
    "calibrate",
    "estimate_line",
    "timed",
]

WARM_S = 1.0
"""A warm-up call this long is the measure (one call: its one-off costs are small beside it)."""
REPEAT_S = 0.3
"""The timed call is repeated while the probe of a phase has spent less than this."""
TIMED_CALLS = 3
"""Timed calls at most after the warm-up (their median is the measure)."""


@dataclass(kw_only=True, slots=True, frozen=True)
class Calibration:
    """The estimate once a probe measured this device at the request's shape."""

    estimate: CostEstimate
    """The FLOPs estimate with each probed phase's seconds scaled by :attr:`ratios`."""
    ratios: dict[str, float]
    """Measured / modelled seconds of the probed work, by phase (sampling, decoding)."""
    measured: dict[str, float]
    """Seconds of one probed call, by phase."""
    spent_s: float
    """Seconds the probe took, warm-up calls included."""


def timed(fn: Callable[[], Any], device: torch.device) -> tuple[float, float]:
    """(seconds of one warm call of ``fn``, seconds spent): one warm-up call, then the median of
    1 to :data:`TIMED_CALLS` timed calls, repeated while under :data:`REPEAT_S` spent; a warm-up
    that took :data:`WARM_S` or more is the measure itself."""

    def once() -> float:
        t0 = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return time.perf_counter() - t0

    with torch.no_grad():
        spent = once()
        if spent >= WARM_S:
            return spent, spent
        times: list[float] = []
        while len(times) < TIMED_CALLS and (not times or spent < REPEAT_S):
            times.append(once())
            spent += times[-1]
    return statistics.median(times), spent


def calibrate(
    est: CostEstimate,
    gen: Generation,
    loaded: LoadedDiT,
    request: GenerateRequest,
    plan: LatentPlan,
    decoder: Any,
    *,
    guidance: float,
) -> Calibration:
    """Probe the model (and ``decoder``, when there is one) at ``plan``'s shape on their device
    and scale ``est``'s phases by what they measure (see the module docstring). Every rank of a
    process group calls this: they agree on the slowest rank's measures."""
    device = next(loaded.model.parameters()).device
    measured, spent = {}, 0.0
    call = gen.probe_call(loaded, request, plan, guidance=guidance)
    measured["sampling"], s = timed(call, device)
    spent += s
    modelled = {"sampling": est.call_s}
    if decoder is not None:
        param = next(decoder.parameters())
        shape = (1, plan.latent[0], 1, *plan.latent[2:])  # (1, C, 1, h, w): one latent frame
        z = torch.zeros(shape, dtype=param.dtype, device=param.device)
        measured["decoding"], s = timed(lambda: decoder.decode(z), param.device)  # (1, 3, 1, H, W)
        spent += s
        modelled["decoding"] = decoder_flops(decoder.cfg, 1, plan.height, plan.width) / est.rate
    measured = _slowest_rank(measured, device)
    ratios = {k: measured[k] / max(modelled[k], 1e-12) for k in measured}
    times = {k: v * ratios.get(k, 1.0) for k, v in est.times.items()}
    seconds = sum(times.values())
    calibrated = replace(
        est,
        times=times,
        rate=est.flops / max(seconds, 1e-12),
        rate_source="measured by a probe of the model at this shape on this device",
    )
    return Calibration(estimate=calibrated, ratios=ratios, measured=measured, spent_s=spent)


def _slowest_rank(measured: dict[str, float], device: torch.device) -> dict[str, float]:
    """Each phase's largest measure over the ranks of the default group (one all-reduce)."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return measured
    dev = device if dist.get_backend() == "nccl" else torch.device("cpu")
    values = torch.tensor(list(measured.values()), dtype=torch.float64, device=dev)
    dist.all_reduce(values, op=dist.ReduceOp.MAX)
    return dict(zip(measured, values.tolist(), strict=True))


def _seconds(s: float) -> str:
    return f"{s:.2g} s" if s < 10 else format_duration(s)


def estimate_line(cal: Calibration, *, peak_gib: float) -> str:
    """``estimated 12 s: sampling 11 s (47 calls of 0.23 s, 3.1x the FLOPs rate), decoding
    0.4 s, writing 0.3 s; 0.2 GiB peak`` (the line logged before sampling)."""
    est, r = cal.estimate, cal.ratios
    parts = [
        f"sampling {_seconds(est.times['sampling'])} ({est.calls} calls of "
        f"{_seconds(cal.measured['sampling'])}, {r['sampling']:.2g}x the FLOPs estimate)"
    ]
    if "decoding" in r:
        parts.append(
            f"decoding {_seconds(est.times['decoding'])} ({r['decoding']:.2g}x the FLOPs estimate)"
        )
    parts.append(f"writing {_seconds(est.times['writing'])}")
    return (
        f"estimated {_seconds(est.seconds)}: {', '.join(parts)}; {peak_gib:.2g} GiB peak "
        f"(probe {_seconds(cal.spent_s)})"
    )


def after_line(measured_s: float, estimated_s: float) -> str:
    """``generated in X s (estimated Y s, ratio Z)``: Z = measured / estimated, X and Y in
    seconds to 3 significant digits (whole seconds from 100 s)."""
    ratio = measured_s / max(estimated_s, 1e-9)
    x, y = (f"{s:.3g}" if s < 100 else f"{s:.0f}" for s in (measured_s, estimated_s))
    return f"generated in {x} s (estimated {y} s, ratio {ratio:.2f})"
