"""The flags of ``vfm generate`` / ``python -m vfm_core.infer.main`` (kept free of torch imports so
``vfm --help`` stays fast)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from vfm_core.infer.shapes import parse_size

if TYPE_CHECKING:
    from vfm_core.infer.generate import GenerateRequest


def add_generate_args(ap: argparse.ArgumentParser) -> None:
    """The flags shared by ``vfm generate`` and this entry point."""
    ap.add_argument(
        "--checkpoint",
        required=True,
        help="run dir of `vfm train` (or a step dir), or models:/NAME@ALIAS | models:/NAME/VERSION",
    )
    ap.add_argument("--prompt", required=True, help="text prompt")
    ap.add_argument("--frames", type=int, default=13, help="frames (rounded up to 1 + t_c*k)")
    ap.add_argument("--size", default="64x64", help="HxW in pixels")
    ap.add_argument("--seed", type=int, default=0, help="noise seed (same video on any --nproc)")
    ap.add_argument("--out", required=True, help="output FILE.mp4 (+ FILE.gif, FILE.latent.npy)")
    ap.add_argument("--steps", type=int, help="sampler steps (default: the run's config)")
    ap.add_argument("--guidance", type=float, help="classifier-free guidance scale in [0, 30]")
    ap.add_argument("--tokenizer", help="tokenizer dir (default: the run's data.tokenizer)")
    ap.add_argument("--fps", type=int, default=8, help="frame rate of the MP4/GIF")
    ap.add_argument("--no-gif", action="store_true", help="do not write FILE.gif")
    ap.add_argument(
        "--temperature",
        type=float,
        default=1.0,
        help="autoregressive runs: token temperature (0 = greedy)",
    )
    ap.add_argument("--top-k", type=int, default=0, help="autoregressive runs: top-k (0 = all)")
    ap.add_argument("--top-p", type=float, default=1.0, help="autoregressive runs: nucleus p")
    prompt = ap.add_mutually_exclusive_group()
    prompt.add_argument(
        "--prompt-video",
        metavar="PATH",
        help="continue this video (mp4/gif at --size): its first --prompt-frames latent frames, "
        "encoded with the run's tokenizer (diffusion runs: trained with diffusion.frame_cond)",
    )
    prompt.add_argument(
        "--prompt-image",
        metavar="PATH",
        help="diffusion runs trained with diffusion.frame_cond: start the video from this image "
        "(png/jpg at --size; image-to-video)",
    )
    prompt.add_argument(
        "--prompt-tokens",
        metavar="FILE",
        help="autoregressive runs: continue these ids (T, h, w) int .npy, as "
        "written to OUT.tokens.npy",
    )
    ap.add_argument(
        "--prompt-frames",
        type=int,
        default=1,
        metavar="K",
        help="latent frames of the prompt to keep (default 1)",
    )
    bounds = ap.add_argument_group(
        "bounds",
        "requests estimated over a bound are refused before any work (vfm_core.infer.budget)",
    )
    bounds.add_argument(
        "--max-memory-gib",
        type=float,
        metavar="G",
        help="refuse requests estimated to need more memory (default: 75%% of what is available)",
    )
    bounds.add_argument(
        "--max-minutes",
        type=float,
        default=10.0,
        metavar="M",
        help="refuse requests estimated to take longer (default 10)",
    )
    bounds.add_argument(
        "--device-tflops",
        type=float,
        metavar="T",
        help="TFLOP/s the time estimate assumes (default: measured on this CPU)",
    )
    bounds.add_argument(
        "--force", action="store_true", help="run a request over a bound anyway (a warning)"
    )


def request_from_args(args: argparse.Namespace) -> GenerateRequest:
    from vfm_core.infer.budget import GenerateBounds
    from vfm_core.infer.generate import GenerateRequest  # noqa: F811 (torch-free import time)

    h, w = parse_size(args.size)
    bounds = GenerateBounds(
        max_memory_gib=args.max_memory_gib,
        max_minutes=args.max_minutes,
        force=args.force,
        device_tflops=args.device_tflops,
    )
    return GenerateRequest(
        prompt=args.prompt,
        frames=args.frames,
        height=h,
        width=w,
        seed=args.seed,
        steps=args.steps,
        guidance=args.guidance,
        fps=args.fps,
        gif=not args.no_gif,
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        prompt_tokens=args.prompt_tokens,
        prompt_video=args.prompt_video,
        prompt_image=args.prompt_image,
        prompt_frames=args.prompt_frames,
        bounds=bounds.check(),
    )
