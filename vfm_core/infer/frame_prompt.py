"""A diffusion run's frame prompt: the first frames of a video (``--prompt-video``) or one image
(``--prompt-image``, image-to-video), encoded by the run's continuous tokenizer into the clean
latent frames the sampler keeps and continues
(:func:`vfm_core.infer.diffusion_generation.frame_conditioned`). The run must have been trained
to continue clips (``diffusion.frame_cond`` > 0, at most ``diffusion.frame_cond_max`` frames);
every user error is one :class:`~vfm_core.infer.shapes.GenerateError` naming the flag."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from vfm_core.config import Config
from vfm_core.infer.shapes import GenerateError, LatentPlan

if TYPE_CHECKING:
    from vfm_core.infer.request import GenerateRequest

__all__ = ["check_frame_prompt", "encode_prompt_frames", "prompt_pixels"]


def check_frame_prompt(cfg: Config, request: GenerateRequest) -> None:
    """A frame prompt the run can continue (before anything loads)."""
    if request.prompt_video is None and request.prompt_image is None:
        return
    flag = "--prompt-video" if request.prompt_video is not None else "--prompt-image"
    d, k = cfg.diffusion, request.prompt_frames
    if not d.frame_cond:
        raise GenerateError(
            f"{flag}: this run was not trained to continue clips (diffusion.frame_cond=0); "
            "train it with --set diffusion.frame_cond=0.5 (e.g. fine-tune it: vfm train --init)"
        )
    if request.prompt_image is not None and k != 1:
        raise GenerateError(f"--prompt-frames {k}: an image is one frame (give --prompt-video)")
    if k > d.frame_cond_max or k % cfg.model.patch[0]:
        raise GenerateError(
            f"--prompt-frames {k}: the run trained on at most diffusion.frame_cond_max="
            f"{d.frame_cond_max} clean latent frames, multiples of model.patch[0]="
            f"{cfg.model.patch[0]}"
        )


def encode_prompt_frames(
    path: Path, flag: str, *, frames: int, plan: LatentPlan, tokenizer: Any, s: int
) -> torch.Tensor:
    """(1, C, K, h, w) normalised latents of the first ``1 + t_c·(K-1)`` frames at ``path``
    (a video, or an image: one frame), as the run's shards hold them."""
    if tokenizer is None:
        raise GenerateError(
            f"{flag}: encoding the prompt needs the run's tokenizer (--tokenizer, or "
            "data.tokenizer in the run config)"
        )
    if frames >= plan.latent[1]:
        raise GenerateError(
            f"--prompt-frames {frames}: the video has {plan.latent[1]} latent frames; leave some "
            "to generate (raise --frames)"
        )
    x = prompt_pixels(path, f"{flag} {path}", frames, (plan.height, plan.width), tokenizer)
    with torch.no_grad():
        return tokenizer.encode(x).float()  # (1, C, K, h, w) normalised


def prompt_pixels(
    path: Path, flag: str, frames: int, size: tuple[int, int], tokenizer: Any
) -> torch.Tensor:
    """(1, 3, 1 + t_c·(K-1), H, W) pixels in [-1, 1] (the tokenizer's dtype) of the first
    frames of the video or image at ``path`` for a prompt of ``frames`` latent frames at
    ``size`` (H, W); every problem a GenerateError led by ``flag``."""
    from vfm_core.tokenizer.autoencoder import pixels_from_uint8
    from vfm_core.video.io import VideoError, decode_frames

    if not path.is_file():
        raise GenerateError(f"{flag}: no such file")
    try:
        video = decode_frames(path)  # (F, H, W, 3) uint8
    except VideoError as e:
        raise GenerateError(f"{flag}: {e.reason}") from None
    if tuple(video.shape[1:3]) != tuple(size):
        h, w = video.shape[1:3]
        raise GenerateError(
            f"{flag}: frames are {h}x{w}, the requested --size is {size[0]}x{size[1]} "
            f"(use --size {h}x{w})"
        )
    t_c = tokenizer.cfg.temporal_factor
    need = 1 + t_c * (frames - 1)
    if video.shape[0] < need:
        raise GenerateError(
            f"{flag}: has {video.shape[0]} frames; --prompt-frames {frames} needs {need} "
            f"(1 + {t_c}·(K-1))"
        )
    x = torch.from_numpy(video[:need]).permute(3, 0, 1, 2)[None]  # (1, 3, F, H, W) uint8
    return pixels_from_uint8(x).to(next(tokenizer.parameters()).dtype)
