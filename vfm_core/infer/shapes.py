"""From a requested video (frames, H x W) to the latent the DiT samples, and the checks on it.

Frame-count rule (documented contract of ``vfm generate --frames F``): a causal tokenizer with
temporal factor ``t_c`` takes ``1 + t_c·k`` frames (-> ``1 + k`` latent frames), and the DiT needs
the latent frame count divisible by its temporal patch. Any other ``F`` is **rounded up** to the
smallest count that satisfies both, with a :class:`FramesRoundedWarning` naming both numbers; the
written video then has the rounded count. Sizes are not rounded: H and W must be multiples of the
spatial factor times the DiT's spatial patch (a clear :class:`GenerateError` otherwise).
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

from vfm_core.errors import UserError

__all__ = [
    "BeyondTrainingWarning",
    "FramesRoundedWarning",
    "GenerateError",
    "LatentPlan",
    "parse_size",
    "plan_latent",
    "warn_beyond_training",
]


class GenerateError(UserError, ValueError):
    """A user-supplied generation input is wrong; the message names the input and the problem."""


class FramesRoundedWarning(UserWarning):
    """The requested frame count was rounded up to one the tokenizer and DiT can take."""


class BeyondTrainingWarning(UserWarning):
    """The requested video is longer or larger than every latent the run trained on."""


def warn_beyond_training(
    plan: LatentPlan, trained: tuple[int, int, int], *, temporal_factor: int, spatial_factor: int
) -> None:
    """Warn when ``plan``'s latent (T', h, w) exceeds the run's training latent ``trained``
    (unpacked runs train on one shape): the model never saw such a video, so its motion and
    layout there are extrapolation."""
    t, h, w = plan.latent[1:]
    tt, th, tw = trained
    if t > tt or h > th or w > tw:
        frames = 1 + temporal_factor * (tt - 1)
        warnings.warn(
            f"--frames {plan.frames} --size {plan.height}x{plan.width}: the run trained on "
            f"{frames} frames at {th * spatial_factor}x{tw * spatial_factor} (latent {tt}x{th}x"
            f"{tw}); a longer or larger video is outside what it learned",
            BeyondTrainingWarning,
            stacklevel=3,
        )


@dataclass(kw_only=True, slots=True, frozen=True)
class LatentPlan:
    """Shapes of one generation."""

    frames: int
    """Pixel frames that will be written (the request, rounded up if needed)."""
    height: int
    """Pixel height."""
    width: int
    """Pixel width."""
    latent: tuple[int, int, int, int]
    """Latent (C, T', h, w) sampled by the DiT."""
    tokens: int
    """DiT tokens of that latent (after patchify); split over the CP ranks."""


def parse_size(text: str) -> tuple[int, int]:
    """``"HxW"`` -> (H, W); anything else raises :class:`GenerateError`."""
    parts = str(text).lower().split("x")
    try:
        h, w = (int(p) for p in parts)
    except ValueError:
        raise GenerateError(f"--size {text!r}: expected HxW, e.g. 64x64") from None
    if h <= 0 or w <= 0:
        raise GenerateError(f"--size {text!r}: height and width must be positive")
    return h, w


def plan_latent(
    frames: int,
    height: int,
    width: int,
    *,
    temporal_factor: int,
    spatial_factor: int,
    channels: int,
    patch: tuple[int, int, int],
    cp: int = 1,
) -> LatentPlan:
    """Latent shape for a video request (see the module docstring for the rounding rule)."""
    if isinstance(frames, bool) or not isinstance(frames, int) or frames < 1:
        raise GenerateError(f"--frames: must be an integer >= 1, got {frames!r}")
    pt, ph, pw = patch
    step_h, step_w = spatial_factor * ph, spatial_factor * pw
    if height % step_h or width % step_w:
        raise GenerateError(
            f"--size {height}x{width}: height must be a multiple of {step_h} and width of "
            f"{step_w} (tokenizer spatial factor {spatial_factor} x DiT patch {ph}x{pw})"
        )
    k = math.ceil((frames - 1) / temporal_factor)
    while (1 + k) % pt:
        k += 1
    used = 1 + temporal_factor * k
    if used != frames:
        warnings.warn(
            f"--frames {frames}: the tokenizer takes 1 + {temporal_factor}·k frames and the DiT "
            f"a latent length divisible by {pt}; generating {used} frames instead",
            FramesRoundedWarning,
            stacklevel=2,
        )
    lat = (channels, 1 + k, height // spatial_factor, width // spatial_factor)
    tokens = (lat[1] // pt) * (lat[2] // ph) * (lat[3] // pw)
    if tokens % cp:
        raise GenerateError(
            f"{tokens} latent tokens ({used} frames at {height}x{width}) cannot be split evenly "
            f"over {cp} context-parallel ranks; choose another --size/--frames or --nproc"
        )
    return LatentPlan(frames=used, height=height, width=width, latent=lat, tokens=tokens)
