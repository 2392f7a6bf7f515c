"""One generation request, and what is checked about it before sampling starts.

In order (:func:`vfm_core.infer.generate.generate`; ``vfm generate`` runs the cheap ones before
the text model and the checkpoint load):

1. the scalar inputs: prompt, guidance, steps, the rest (:func:`check_prompt`,
   :func:`check_guidance`, :func:`check_steps`, :func:`check_options`) and the output path
   (:func:`vfm_core.infer.video_out.check_writable`);
2. the **plan**: the decoder's factors and the latent for ``frames`` x H x W
   (:func:`plan_request`; :mod:`vfm_core.infer.shapes`), for autoregressive runs the checked
   token prompt (:func:`request_prompt`); what differs by family (options refused, latent channels,
   the decoder, the cost model) the run's :class:`~vfm_core.infer.generation.Generation` says;
3. the **cost**: estimated memory and time against the request's bounds
   (:func:`check_cost`; :mod:`vfm_core.infer.budget`). :func:`preflight` does 2-3 from the run's
   config and the tokenizer's metadata alone, before any weights are read.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from vfm_core.config import Config
from vfm_core.infer.ar_sample import SamplingConfig, SamplingError
from vfm_core.infer.budget import CostEstimate, GenerateBounds, check_bounds, check_time
from vfm_core.infer.decoders import load_decoder, load_token_decoder
from vfm_core.infer.device import device_rate
from vfm_core.infer.family_generation import generation_of
from vfm_core.infer.shapes import GenerateError, LatentPlan, plan_latent, warn_beyond_training
from vfm_core.tokenizer.config import TokenizerConfig
from vfm_core.tokenizer.run_settings import tokenizer_config

__all__ = [
    "GUIDANCE_RANGE",
    "PREVIEW_FACTORS",
    "STEPS_RANGE",
    "GenerateRequest",
    "ar_prompt_ids",
    "check_cost",
    "check_guidance",
    "check_measured_time",
    "check_options",
    "check_prompt",
    "check_steps",
    "decoder_and_plan",
    "load_decoder",
    "load_token_decoder",
    "plan_request",
    "preflight",
    "request_prompt",
    "tokenizer_config",
]

GUIDANCE_RANGE = (0.0, 30.0)
"""Accepted classifier-free guidance scales (0 = unconditional, 1 = conditional, >1 = guided)."""
STEPS_RANGE = (1, 1000)
"""Accepted sampler step counts."""
PREVIEW_FACTORS = (4, 8)
"""(temporal, spatial) factors assumed when no tokenizer is available (tok-tiny's 4x8x8)."""


@dataclass(kw_only=True, slots=True)
class GenerateRequest:
    """One video to generate."""

    prompt: str
    """Text prompt (must not be empty)."""
    frames: int = 13
    """Pixel frames (rounded up to 1 + t_c·k, see :mod:`vfm_core.infer.shapes`)."""
    height: int = 64
    """Pixel height (multiple of spatial factor x patch)."""
    width: int = 64
    """Pixel width (multiple of spatial factor x patch)."""
    seed: int = 0
    """Seed of the initial noise (same video for any number of ranks)."""
    steps: int | None = None
    """Sampler steps (None = the run's ``diffusion.num_steps``)."""
    guidance: float | None = None
    """Classifier-free guidance scale in :data:`GUIDANCE_RANGE` (None = run's
    ``diffusion.guidance``)."""
    fps: int = 8
    """Frame rate of the written MP4 / GIF."""
    gif: bool = True
    """Also write ``OUT.gif`` (needs Pillow)."""
    temperature: float = 1.0
    """Autoregressive family: softmax temperature of the token draws (0 = greedy)."""
    top_k: int = 0
    """Autoregressive family: keep the k most likely tokens (0 = all)."""
    top_p: float = 1.0
    """Autoregressive family: nucleus, in (0, 1]."""
    prompt_tokens: str | None = None
    """Autoregressive family: ``.tokens.npy`` ids (T, h, w) whose first frames are the prompt."""
    prompt_video: str | None = None
    """A video whose first frames are the prompt: tokenized (autoregressive family), or encoded
    as clean latent frames the sampler keeps (diffusion runs trained with
    ``diffusion.frame_cond``)."""
    prompt_image: str | None = None
    """Diffusion family: an image as the first frame (image-to-video)."""
    prompt_frames: int = 1
    """Latent frames of the prompt kept (with a prompt file or video)."""
    bounds: GenerateBounds = field(default_factory=GenerateBounds)
    """Memory and time bounds (``--max-memory-gib``, ``--max-minutes``, ``--force``)."""
    progress: bool = True
    """Show the progress of sampling on stderr once it has run a few seconds (rank 0)."""


# ------------------------------------------------------------------ scalar inputs
def check_guidance(guidance: float) -> float:
    lo, hi = GUIDANCE_RANGE
    g = float(guidance)
    if not math.isfinite(g) or not lo <= g <= hi:
        raise GenerateError(
            f"--guidance {guidance}: must be a number in [{lo:g}, {hi:g}] (0 = unconditional, "
            "1 = no guidance, typical 2-7)"
        )
    return g


def check_steps(steps: int) -> int:
    lo, hi = STEPS_RANGE
    if isinstance(steps, bool) or not isinstance(steps, int) or not lo <= steps <= hi:
        raise GenerateError(f"--steps {steps!r}: must be an integer in [{lo}, {hi}]")
    return steps


def check_options(request: GenerateRequest) -> None:
    """The request's other numbers, each named by its flag (before anything loads)."""
    r = request
    if r.fps < 1:
        raise GenerateError(f"--fps {r.fps}: must be an integer >= 1")
    if r.seed < 0:
        raise GenerateError(f"--seed {r.seed}: must be an integer >= 0")
    try:  # the token draws' settings, by the sampler's own rules
        SamplingConfig(temperature=r.temperature, top_k=r.top_k, top_p=r.top_p).check()
    except SamplingError as e:
        raise GenerateError(str(e)) from None
    if r.prompt_frames < 1:
        raise GenerateError(f"--prompt-frames: must be an integer >= 1, got {r.prompt_frames}")


def check_prompt(prompt: str) -> str:
    if not isinstance(prompt, str) or not prompt.strip():
        raise GenerateError(f"--prompt {prompt!r}: the prompt is empty; describe the video")
    try:  # bytes that are not UTF-8 reach Python as lone surrogates (surrogateescape)
        prompt.encode("utf-8")
    except UnicodeEncodeError as e:
        raise GenerateError(
            f"--prompt: not valid UTF-8 text (at character {e.start}: "
            f"{prompt[e.start : e.end]!r}); pass the prompt as UTF-8"
        ) from None
    return prompt.strip()


# ------------------------------------------------------------------ the plan
def plan_request(
    cfg: Config, request: GenerateRequest, tok: TokenizerConfig | None, world: int
) -> tuple[LatentPlan, int, int]:
    """(plan, temporal factor, spatial factor) of ``request`` on ``world`` ranks with a decoder
    of config ``tok`` (None: the latent preview)."""
    gen = generation_of(cfg)
    gen.check_request(cfg, request)  # the other family's options refused, never ignored
    t_c, s = (tok.temporal_factor, tok.spatial_factor) if tok else PREVIEW_FACTORS
    plan = plan_latent(
        request.frames,
        request.height,
        request.width,
        temporal_factor=t_c,
        spatial_factor=s,
        channels=gen.latent_channels(cfg, tok),
        patch=tuple(cfg.model.patch),
        cp=gen.latent_split(world),
    )
    if cfg.data.max_tokens == 0:  # unpacked: every training latent had the configured shape
        d = cfg.data
        warn_beyond_training(
            plan,
            (d.latent_frames, d.latent_height, d.latent_width),
            temporal_factor=t_c,
            spatial_factor=s,
        )
    return plan, t_c, s


def decoder_and_plan(cfg: Config, request: GenerateRequest, tok_path: Any, world: int):
    """(decoder or None, LatentPlan, spatial factor) of a request on ``world`` ranks."""
    decoder = generation_of(cfg).load_decoder(cfg, tok_path) if tok_path else None
    plan, _, s = plan_request(cfg, request, decoder.cfg if decoder else None, world)
    return decoder, plan, s


def request_prompt(
    cfg: Config, request: GenerateRequest, decoder: Any, plan: LatentPlan, s: int
) -> torch.Tensor | None:
    """The checked prompt of a request (:meth:`Generation.prompt`: ids (1, K*h*w) or latent
    frames (1, C, K, h, w)), or None."""
    return generation_of(cfg).prompt(cfg, request, decoder, plan, s)


def ar_prompt_ids(
    cfg: Config, request: GenerateRequest, *, tokenizer: str | Path | None = None
) -> np.ndarray | None:
    """The checked prompt ids (K, h, w) int32 of an autoregressive request (None without a
    prompt), from the run's config alone: ``vfm generate`` reads the prompt with this before the
    text model loads and hands the ids on (to :func:`generate` or the ranks) as a tokens file."""
    with warnings.catch_warnings():  # the ranks warn about rounded frame counts
        warnings.simplefilter("ignore")
        tok_path = tokenizer or cfg.data.tokenizer or None
        decoder, plan, s = decoder_and_plan(cfg, request, tok_path, 1)
    ids = request_prompt(cfg, request, decoder, plan, s)
    return None if ids is None else ids.view(-1, *plan.latent[2:]).numpy().astype(np.int32)


# ------------------------------------------------------------------ the cost
def _shrink_flags(cfg: Config, plan: LatentPlan) -> list[str]:
    """The flags that make the request smaller: those beyond the run's training shape (unpacked
    runs), else both."""
    flags = []
    if cfg.data.max_tokens == 0:
        t, h, w = plan.latent[1:]
        d = cfg.data
        if h > d.latent_height or w > d.latent_width:
            flags.append("--size")
        if t > d.latent_frames:
            flags.append("--frames")
    return flags or ["--size", "--frames"]


def check_cost(
    cfg: Config,
    request: GenerateRequest,
    plan: LatentPlan,
    tok: TokenizerConfig | None,
    *,
    steps: int,
    guidance: float,
    world: int = 1,
    device: torch.device | str = "cpu",
    dtype_bytes: int = 4,
    resident_bytes: float = 0.0,
) -> CostEstimate:
    """Estimate the request's memory and time (:mod:`vfm_core.infer.budget`) and refuse it in
    one line when over a bound of ``request.bounds`` (``--force``: a warning). ``world`` ranks
    share this host; ``resident_bytes``: weights this process already holds."""
    bounds = request.bounds.check()
    rate = device_rate(device, width=cfg.model.hidden, tflops=bounds.device_tflops)
    dev_type = torch.device(device).type
    common = dict(decoder=tok, ranks=world, rate=rate, device_type=dev_type)
    gen = generation_of(cfg)
    est = gen.estimate(
        cfg, request, plan, steps=steps, guidance=guidance, dtype_bytes=dtype_bytes, **common
    )
    check_bounds(
        est,
        request.bounds,
        request=_named(request),
        flags=_shrink_flags(cfg, plan),
        time_flags=gen.time_flags(steps),
        resident_bytes=resident_bytes,
        device=device,
    )
    return est


def check_measured_time(
    cfg: Config, request: GenerateRequest, plan: LatentPlan, est: CostEstimate, *, steps: int
) -> None:
    """The time bound of :func:`check_cost` for the estimate a probe of the loaded model measured
    (:mod:`vfm_core.infer.probe`): the same one line, or a warning with ``--force``."""
    flags = [*_shrink_flags(cfg, plan), *generation_of(cfg).time_flags(steps)]
    check_time(est, request.bounds, request=_named(request), flags=flags)


def _named(request: GenerateRequest) -> str:
    return f"--frames {request.frames} --size {request.height}x{request.width}"


def preflight(
    cfg: Config, request: GenerateRequest, *, tokenizer: str | Path | None = None, world: int = 1
) -> CostEstimate | None:
    """Plan and cost-check ``request`` from the run's config and the tokenizer's metadata alone,
    before any weights are read (weights load on the CPU in fp32); None when the tokenizer's
    config cannot be read that way (:func:`generate` checks after loading it)."""
    tok_path = tokenizer or cfg.data.tokenizer or None
    tok = tokenizer_config(tok_path) if tok_path else None
    if tok_path and tok is None:
        return None
    guidance = check_guidance(
        cfg.diffusion.guidance if request.guidance is None else request.guidance
    )
    steps = check_steps(cfg.diffusion.num_steps if request.steps is None else request.steps)
    with warnings.catch_warnings():  # generate() warns: rounding, extrapolation, --force
        warnings.simplefilter("ignore")
        plan, _, _ = plan_request(cfg, request, tok, world)
        return check_cost(cfg, request, plan, tok, steps=steps, guidance=guidance, world=world)
