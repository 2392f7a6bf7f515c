"""What one generation will cost, estimated from the run's config before anything large is built,
and the bounds a request must fit (``vfm generate --max-memory-gib G --max-minutes M --force``).

A request far beyond the machine (``--size 100000x100000``, ``--frames 100001``) is refused in one
line that shows the estimate, the bound and the flag to change, before it allocates anything
(:func:`check_bounds`); ``--force`` runs it anyway with a warning.

**Memory**: peak bytes on this host, the weights plus the largest of three phases (sampling,
decoding, writing; parts summed within a phase). Sampling keeps no autograd graph, so one
block's tensors are live at a time, not ``depth`` of them. b: bytes per element of the model's
weights (4 on CPU); E = C·T'·h·w latent elements; N video tokens; B = 2 under classifier-free
guidance (cond and uncond in one batch) else 1; D hidden, M MLP width, H heads, L text tokens;
n = T'·h·w AR tokens, m = P + 1 prefill inputs (BOS and the prompt); V = F·H·W output pixels.

===========  ========================================  =========================================
part         DiT                                       AR
===========  ========================================  =========================================
weights      parameters·b (every rank)                 parameters·b (every rank)
sampler      12·E·4: noise, x, d, x', d', the CFG      ids, RoPE angles and codes:
             copies [x, x] and the model output        n·(8·B + d_head/2·4 + 3·C·4)
activations  B·N·(14·D + 3·M)·b: one block's stream,   B·m·(14·D + 3·M)·b over the prefill
             norms, q, k, v and their RoPE copies,
             attention output, MLP
attention    cross-attention scores B·H·N·L·4;         causal mask m² (bool) and cross scores
             ``attn_backend=math``: + 2·B·H·ΣS²·4      B·H·m·L·4; ``math``: + 2·B·H·m²·4
kv cache     –                                         2·depth·B·H_kv·n·d_head·b (every rank)
logits       –                                         B·m·vocab·b: the prefill's head runs on
                                                       every input position
decoder      decoding phase: the tokenizer's decoder at full size, its first stage's tensors
             (:func:`decoder_bytes`) and the 3-channel output twice; without a tokenizer the
             latent preview's up-sampled copies, 36·V
frames       writing phase: the float video (12·V), its uint8 conversion (24·V transient, 6·V),
             the GIF images (3·V), ~3·V of allocator slack and the H.264 encoder's look-ahead
             (1.5·H·W per frame, up to 60 frames)
===========  ========================================  =========================================

Measured on 2 CPU cores (peak RSS growth, dit-tiny): sampling 16,384 tokens with guidance 3:
226 MiB against 208 estimated with 12·D (hence 14·D); decoding 13 x 1024² with a 16- and a
32-channel tokenizer: 43 and 49 B/pixel against 42 and 60.

Flash attention (torch SDPA on CPU and CUDA) keeps no S×S matrix: self-attention adds nothing to
the block's q, k, v and output unless ``model.attn_backend=math``. The text encoder (loaded once,
~100 MB for MiniLM) is not counted.

**Time**: the matmul FLOPs of every model call (:func:`vfm_core.perf.flops.forward_flops`): the
DiT's forward over N tokens, times B, for 2·steps − 1 calls (Heun) or ``steps`` (Euler); the AR
model's cached decoding, which is one causal forward over n tokens (Σᵢ 4·i·D_q = its causal
attention count), times B, plus the text keys/values recomputed at each of the n − P calls; and
the decoder's convolutions (2·27·C_in·C_out per output voxel, :func:`decoder_flops`). They run at
the device's FLOP/s (:func:`vfm_core.infer.device.device_rate`; CPU: the GEMM rate measured here
at the model's width or 512, :func:`vfm_core.perf.hardware.measure_cpu_peak`; CUDA: a share of
the datasheet peak, :func:`vfm_core.perf.hardware.peak_flops`), or at ``--device-tflops``, plus
:data:`CALL_OVERHEAD_S` per block call (Python and kernel launches: what dominates token-by-token
decoding of a small model), plus writing the MP4 and GIF at :data:`WRITE_S_PER_PIXEL`.
Context-parallel ranks split the DiT's FLOPs and the AR prefill, not the AR decoding. This is
what the bounds check before any weights load: a floor (a sampler call of a small model reaches
a fraction of the GEMM rate, less on shared cores: 3.5x slower on 2 idle cores, 19x in a loaded
pipeline). Once the weights are loaded, :mod:`vfm_core.infer.probe` scales each phase by
what a short probe of the real model measures at the request's shape: the estimate
``vfm generate`` prints and checks again.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

import torch

from vfm_core.config import ModelConfig
from vfm_core.infer.device import available_memory
from vfm_core.infer.shapes import GenerateError, LatentPlan
from vfm_core.tokenizer.config import TokenizerConfig

__all__ = [
    "CALL_OVERHEAD_S",
    "MAX_MINUTES",
    "MEMORY_FRACTION",
    "WRITE_S_PER_PIXEL",
    "BoundExceededWarning",
    "CostEstimate",
    "GenerateBounds",
    "check_bounds",
    "check_time",
    "decoder_bytes",
    "decoder_flops",
    "estimate_ar",
    "estimate_dit",
]

MEMORY_FRACTION = 0.75
"""Default memory bound: this fraction of the memory available when the request starts (the
weights already loaded by this process count as available)."""
MAX_MINUTES = 10.0
"""Default time bound of one request, minutes."""
CALL_OVERHEAD_S = {"cpu": 1e-3, "cuda": 1.5e-4}
"""Seconds per transformer block and model call beyond its FLOPs (ar-tiny token by token on 2
CPU cores: 0.5-1 ms per block, more when the cores are shared)."""
WRITE_S_PER_PIXEL = {"mp4": 3e-7, "gif": 4e-6}
"""Seconds per output pixel (frames x H x W) of writing the H.264 MP4 and the GIF (Pillow's
palette per frame), measured on 1 shared CPU core with frames of noise, what an untrained model
draws: 0.1-0.4 µs and 2-6 µs (smooth frames of a trained model: 5-20x less; writing then weighs
little beside sampling)."""
GIB = 2.0**30


class BoundExceededWarning(UserWarning):
    """A request over a memory or time bound runs anyway (``--force``)."""


@dataclass(kw_only=True, slots=True)
class GenerateBounds:
    """The bounds one generation must fit (see the module docstring)."""

    max_memory_gib: float | None = None
    """Refuse a request whose estimated peak memory exceeds this many GiB (None:
    :data:`MEMORY_FRACTION` of the memory available)."""
    max_minutes: float = MAX_MINUTES
    """Refuse a request whose estimated time exceeds this many minutes."""
    force: bool = False
    """Run a request over a bound anyway, with a :class:`BoundExceededWarning`."""
    device_tflops: float | None = None
    """TFLOP/s the time estimate assumes (None: measured on this CPU / the GPU's datasheet)."""

    def check(self) -> GenerateBounds:
        for flag, value in (
            ("--max-memory-gib", self.max_memory_gib),
            ("--max-minutes", self.max_minutes),
            ("--device-tflops", self.device_tflops),
        ):
            if value is not None and not (math.isfinite(value) and value > 0):
                raise GenerateError(f"{flag} {value}: must be a positive number")
        return self


@dataclass(kw_only=True, slots=True, frozen=True)
class CostEstimate:
    """Estimated peak memory and time of one generation."""

    weights: float
    """Bytes of the model (and decoder) weights on this host."""
    phases: dict[str, dict[str, float]]
    """Bytes by part of each phase (sampling, decoding, writing), beside the weights."""
    flops: float
    """Matmul / convolution FLOPs of the whole request."""
    calls: int
    """Model calls (denoiser evaluations, or one per sampled token)."""
    times: dict[str, float]
    """Estimated seconds by phase: sampling, decoding (the tokenizer) and writing the files."""
    call_s: float
    """Estimated seconds of one steady model call over the whole sequence on one rank: a
    denoiser call, or one cached token step half-way through the video (what
    :mod:`vfm_core.infer.probe` times)."""
    rate: float
    """FLOP/s assumed."""
    rate_source: str
    """Where :attr:`rate` comes from."""

    @property
    def seconds(self) -> float:
        """Estimated wall time of sampling, decoding and writing."""
        return sum(self.times.values())

    @property
    def peak_bytes(self) -> float:
        return self.weights + max(sum(p.values()) for p in self.phases.values())

    def parts(self) -> tuple[str, dict[str, float]]:
        """(the phase of :attr:`peak_bytes`, its parts with the weights, largest first)."""
        name = max(self.phases, key=lambda k: sum(self.phases[k].values()))
        parts = {"weights": self.weights, **self.phases[name]}
        return name, dict(sorted(parts.items(), key=lambda kv: -kv[1]))


# ------------------------------------------------------------------ memory and FLOPs by part
def _widths(tok: TokenizerConfig) -> list[int]:
    return [tok.base_channels * m for m in tok.channel_mult]


def _stage_voxels(tok: TokenizerConfig, frames: int, height: int, width: int, i: int) -> float:
    """Voxels of the decoder's stage i (0: the first, at 1/patch of the video) for ``frames`` =
    1 + t_c·k: causal up-sampling makes T frames 2T - 1, so stage i has 1 + (frames - 1) /
    (patch_t·2^t) frames after t temporal and s spatial halvings."""
    t, s = min(i, tok.temporal_down_stages), min(i, tok.spatial_down_stages)
    f = 1 + (frames - 1) // (tok.patch_t * 2**t)
    return float(f) * (height // (tok.patch_s * 2**s)) * (width // (tok.patch_s * 2**s))


def decoder_bytes(tok: TokenizerConfig, frames: int, height: int, width: int) -> float:
    """Peak bytes of ``tok``'s decoder (fp32) for a video of ``frames`` x H x W. At its first
    stage a residual block holds its input, the norm and SiLU outputs, the causally padded copy
    and the conv outputs (~6 tensors of width w0); the up-sampling into it the interpolated and
    padded input and the shortcut (~3 of w1, 3 of w0); then the output conv's 3 channels per
    pixel and the unpatchified copy."""
    v = float(frames) * height * width
    v0 = _stage_voxels(tok, frames, height, width, 0)
    w = _widths(tok)
    widest = max(6 * w[0], 3 * w[1] + 3 * w[0]) if len(w) > 1 else 6 * w[0]
    return 4.0 * (widest * v0 + 2 * 3 * v)


def decoder_flops(tok: TokenizerConfig, frames: int, height: int, width: int) -> float:
    """Convolution FLOPs of ``tok``'s decoder, 2·27·C_in·C_out per output voxel of every 3x3x3
    conv: conv_in and the bottleneck block at the latent, per stage the up-sampling conv into it
    and ``num_res_blocks`` blocks of two convs, and the output conv (equal to
    ``torch.utils.flop_counter`` on the module, tested)."""
    w = _widths(tok)

    def voxels(i: int) -> float:
        return _stage_voxels(tok, frames, height, width, i)

    k = 2 * 27
    total = k * voxels(tok.num_stages) * (tok.latent_channels * w[-1] + 2 * w[-1] ** 2)
    for i in range(tok.num_stages):
        total += k * voxels(i) * (w[i + 1] * w[i] + 2 * tok.num_res_blocks * w[i] ** 2)
    return total + k * voxels(0) * w[0] * 3 * tok.patch_t * tok.patch_s**2


def _decoder_params(tok: TokenizerConfig) -> int:
    from vfm_core.tokenizer.autoencoder import CausalVideoAutoencoder

    with torch.device("meta"):
        return sum(p.numel() for p in CausalVideoAutoencoder(tok).decoder.parameters())


def _decoding(
    plan: LatentPlan, tok: TokenizerConfig | None, gif: bool
) -> tuple[dict[str, dict], float, float]:
    """({phase: bytes by part}, FLOPs, seconds of writing) of decoding and writing ``plan``'s
    video (the GIF too when ``gif``)."""
    f, h, w = plan.frames, plan.height, plan.width
    v = float(f) * h * w
    latent = 4.0 * math.prod(plan.latent)
    dec = decoder_bytes(tok, f, h, w) if tok is not None else 36.0 * v
    frames = 48.0 * v + 1.5 * h * w * min(f, 60)
    flops = decoder_flops(tok, f, h, w) if tok is not None else 0.0
    phases = {"decoding": {"latent": latent, "decoder": dec}, "writing": {"frames": frames}}
    write_s = v * (WRITE_S_PER_PIXEL["mp4"] + (WRITE_S_PER_PIXEL["gif"] if gif else 0.0))
    return phases, flops, write_s


def _block_bytes(model: ModelConfig, rows: float, b: int) -> float:
    """One block's live tensors for ``rows`` token rows (see the module docstring)."""
    from vfm_core.families.terms import mlp_width

    mlp = mlp_width(model)
    return rows * (14 * model.hidden + 3 * mlp) * b


def _param_count(model: ModelConfig) -> int:
    from vfm_core.perf.flops import param_count

    return param_count(model)


def _cfg_batch(guidance: float) -> int:
    """Rows per model call: cond and uncond in one batch unless guidance is 0 or 1."""
    return 1 if guidance in (0.0, 1.0) else 2


def estimate_dit(
    model: ModelConfig,
    plan: LatentPlan,
    *,
    steps: int,
    sampler: str,
    guidance: float,
    decoder: TokenizerConfig | None,
    ranks: int = 1,
    rate: tuple[float, str],
    device_type: str = "cpu",
    dtype_bytes: int = 4,
    gif: bool = True,
) -> CostEstimate:
    """Cost of sampling ``plan`` with the DiT ``model`` over ``ranks`` context-parallel ranks on
    this host, decoding and writing it (see the module docstring); ``rate``: (FLOP/s, source);
    ``gif``: a GIF is written beside the MP4."""
    from vfm_core.perf.flops import forward_flops

    b, B = dtype_bytes, _cfg_batch(guidance)
    n = plan.tokens
    pt, ph, pw = model.patch
    _, t, h, w = plan.latent
    grid = (t // pt, h // ph, w // pw)
    attn = B * model.heads * n * model.text_len * 4.0  # cross-attention scores
    if model.attn_backend == "math":
        groups = {"dit": [n], "llama_dit": [n]}.get(
            model.arch, [grid[1] * grid[2]] * grid[0] + [grid[0]] * (grid[1] * grid[2])
        )
        attn += 2.0 * B * model.heads * sum(float(s) ** 2 for s in groups) * 4
    sampling = {
        "sampler": ranks * 12.0 * math.prod(plan.latent) * 4,
        "activations": _block_bytes(model, B * n, b),
        "attention": attn,
    }
    phases, dec_flops, write_s = _decoding(plan, decoder, gif)
    weights = ranks * _param_count(model) * b
    if decoder is not None:
        weights += _decoder_params(decoder) * 4
    calls = 2 * steps - 1 if sampler == "heun" else steps
    per_call = forward_flops(model, seq_lens=n, grid=grid)["total"] * B
    overhead = model.depth * CALL_OVERHEAD_S.get(device_type, CALL_OVERHEAD_S["cpu"])
    times = {
        "sampling": per_call * calls / ranks / rate[0] + calls * overhead,
        "decoding": dec_flops / rate[0],
        "writing": write_s,
    }
    return CostEstimate(
        weights=weights,
        phases={"sampling": sampling, **phases},
        flops=per_call * calls + dec_flops,
        calls=calls,
        times=times,
        call_s=per_call / rate[0] + overhead,
        rate=rate[0],
        rate_source=rate[1],
    )


def estimate_ar(
    model: ModelConfig,
    plan: LatentPlan,
    *,
    guidance: float,
    prompt_tokens: int,
    decoder: TokenizerConfig | None,
    ranks: int = 1,
    rate: tuple[float, str],
    device_type: str = "cpu",
    dtype_bytes: int = 4,
    gif: bool = True,
) -> CostEstimate:
    """Cost of sampling ``plan``'s tokens with the causal video transformer ``model`` after a
    prompt of ``prompt_tokens`` ids (every rank decodes all of them) and decoding them."""
    from vfm_core.perf.flops import forward_flops

    b = dtype_bytes
    B = 1 if guidance == 1.0 else 2  # ar_sample batches cond and uncond whenever g != 1
    c, t, h, w = plan.latent
    n = t * h * w
    m = prompt_tokens + 1
    hd, kv = model.head_dim, model.n_kv_heads
    attn = float(m) * m + B * model.heads * m * model.text_len * 4.0
    if model.attn_backend == "math":
        attn += 2.0 * B * model.heads * float(m) ** 2 * 4
    sampling = {
        "sampler": ranks * float(n) * (8 * B + hd / 2 * 4 + 3 * c * 4),
        "kv cache": ranks * 2.0 * model.depth * B * kv * n * hd * b,
        "activations": _block_bytes(model, B * m, b),
        "attention": attn,
        "logits": float(B) * m * model.vocab_size * b,
    }
    phases, dec_flops, write_s = _decoding(plan, decoder, gif)
    weights = ranks * _param_count(model) * b
    if decoder is not None:
        weights += _decoder_params(decoder) * 4
    calls = max(1, n - prompt_tokens)
    f = forward_flops(model, seq_lens=n)
    model_flops = B * (f["total"] + (calls - 1) * f["cross_kv"])
    overhead = model.depth * CALL_OVERHEAD_S.get(device_type, CALL_OVERHEAD_S["cpu"])
    times = {
        "sampling": model_flops / rate[0] + calls * overhead,
        "decoding": dec_flops / rate[0],
        "writing": write_s,
    }
    # one token half-way: the causal forward's mean per token, plus the text keys / values
    step = B * (f["total"] / n + f["cross_kv"])
    return CostEstimate(
        weights=weights,
        phases={"sampling": sampling, **phases},
        flops=model_flops + dec_flops,
        calls=calls,
        times=times,
        call_s=step / rate[0] + overhead,
        rate=rate[0],
        rate_source=rate[1],
    )


# ------------------------------------------------------------------ the check
def _bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if n < 1024 or unit == "PiB":
            return f"{n:.3g} {unit}" if unit != "B" else f"{n:.0f} B"
        n /= 1024
    raise AssertionError


def _duration(s: float) -> str:
    for unit, size in (("days", 86400), ("h", 3600), ("min", 60)):
        if s >= size:
            return f"{s / size:.3g} {unit}"
    return f"{s:.2g} s"


def check_bounds(
    est: CostEstimate,
    bounds: GenerateBounds,
    *,
    request: str,
    flags: list[str],
    time_flags: tuple[str, ...] = (),
    resident_bytes: float = 0.0,
    device: torch.device | str = "cpu",
) -> None:
    """Raise a one-line :class:`GenerateError` when ``est`` exceeds a bound of ``bounds``
    (memory: ``max_memory_gib`` or :data:`MEMORY_FRACTION` of what ``device`` has available plus
    ``resident_bytes`` already held by this process; time: ``max_minutes``); with
    ``bounds.force`` warn instead. ``request`` names the request (its flags), ``flags`` the
    flags that shrink it, ``time_flags`` those that only shorten it."""
    if bounds.max_memory_gib is not None:
        mem_bound = bounds.max_memory_gib * GIB
        mem_text = "--max-memory-gib"
    else:
        avail = available_memory(device) + resident_bytes
        mem_bound = MEMORY_FRACTION * avail
        where = "on the GPU" if torch.device(device).type == "cuda" else "in RAM"
        mem_text = f"{MEMORY_FRACTION:.0%} of the {_bytes(avail)} available {where}"
        mem_text += "; --max-memory-gib"
    problems = []
    if est.peak_bytes > mem_bound:
        phase, parts = est.parts()
        big = [(k, v) for k, v in parts.items() if v >= 0.01 * est.peak_bytes][:3]
        shown = ", ".join(f"{k} {_bytes(v)}" for k, v in big)
        problems.append(
            f"needs about {_bytes(est.peak_bytes)} of memory ({phase}: {shown}), over the bound "
            f"of {_bytes(mem_bound)} ({mem_text})"
        )
    if (slow := _time_problem(est, bounds)) is not None:
        flags = [*flags, *time_flags]
        problems.append(slow)
    if problems:
        _refuse(f"{request}: {' and '.join(problems)}", bounds, flags)


def check_time(
    est: CostEstimate, bounds: GenerateBounds, *, request: str, flags: list[str]
) -> None:
    """:func:`check_bounds` of the time alone, for the estimate made again once the model is
    loaded (:mod:`vfm_core.infer.probe`): the same one line, or a warning with ``--force``."""
    if (slow := _time_problem(est, bounds)) is not None:
        _refuse(f"{request}: {slow}", bounds, flags)


def _time_problem(est: CostEstimate, bounds: GenerateBounds) -> str | None:
    if est.seconds <= bounds.max_minutes * 60:
        return None
    return (
        f"would take about {_duration(est.seconds)} ({est.flops:.2g} FLOPs in {est.calls} "
        f"model calls at {est.rate:.2g} FLOP/s: {est.rate_source}), over the bound of "
        f"{_duration(bounds.max_minutes * 60)} (--max-minutes)"
    )


def _refuse(msg: str, bounds: GenerateBounds, flags: list[str]) -> None:
    if bounds.force:
        warnings.warn(f"{msg}; running anyway (--force)", BoundExceededWarning, stacklevel=4)
        return
    raise GenerateError(f"{msg}; lower {' or '.join(flags)}, or pass --force to run anyway")
