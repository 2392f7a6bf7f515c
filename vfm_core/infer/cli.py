"""``vfm generate``: the CLI contract, delegating to :mod:`vfm_core.infer`::

    vfm generate --checkpoint DIR --prompt "..." --frames F --size HxW --seed S --out FILE.mp4
                 [--nproc N] [--steps K] [--guidance G] [--tokenizer PATH]
                 [--max-memory-gib G] [--max-minutes M] [--device-tflops T] [--force]
                 [--temperature T --top-k K --top-p P]                       (autoregressive runs)
                 [--prompt-video PATH | --prompt-tokens FILE] [--prompt-frames K]

Before the text model or any weights load, ``--out`` is checked writable and the request's
memory and time are estimated from the run's config (:mod:`vfm_core.infer.budget`): a request
over a bound is refused in one line (``--force`` runs it anyway, with a warning).

A thin wrapper: the flags become a :class:`~vfm_core.infer.request.GenerateRequest` and
:func:`vfm_core.infer.run.generate_request` (what the Prefect generation task calls too) does
the work. ``--nproc 1`` (default) runs in this process. ``--nproc N`` embeds the prompt here (the
text model loads once), then launches ``torchrun --standalone --nproc-per-node N -m
vfm_core.infer.main`` (:func:`vfm_core.launch.launcher.launch_generation`) so N context-parallel
ranks denoise one video together (same noise, same video as one process); their result is read
from ``OUT.result.json``. An autoregressive run's token prompt (``--prompt-tokens`` /
``--prompt-video``) is read and checked here, before the text model loads, and goes on as ids; N
ranks split its prefill and sample the same tokens as one process.
"""

from __future__ import annotations

import argparse
import json
import sys

from vfm_core.infer.args import add_generate_args, request_from_args

__all__ = ["add_parser", "run"]


def add_parser(sub) -> argparse.ArgumentParser:
    g = sub.add_parser(
        "generate", help="text -> video with a trained run, either family (CP over --nproc ranks)"
    )
    add_generate_args(g)
    g.add_argument("--nproc", type=int, default=1, help="context-parallel ranks (torchrun)")
    g.add_argument("--json", action="store_true", help="print the result as one JSON object")
    return g


def _report(result: dict, as_json: bool) -> None:
    if as_json:
        print(json.dumps(result))
        return
    h, w = result["size"]
    print(
        f"generated {result['frames']} frames at {h}x{w} on {result['ranks']} rank(s) in "
        f"{result['sample_s']:.1f} s ({result['steps']} steps, guidance {result['guidance']:g}, "
        f"decoder {result['decoder']})"
    )
    print(f"video: {result['mp4']}   gif: {result['gif']}   latents: {result['latent']}")


def run(args: argparse.Namespace) -> int:
    """Run ``vfm generate``; user errors raise GenerateError / CheckpointError (exit 2 upstream),
    failed ranks exit with their code (their own error line is on the terminal)."""
    from vfm_core.infer.run import generate_request
    from vfm_core.launch.launcher import LaunchError

    request = request_from_args(args)
    try:
        result = generate_request(
            args.checkpoint, request, args.out, tokenizer=args.tokenizer, nproc=args.nproc
        )
    except LaunchError as e:
        print(f"vfm generate: error: {e}", file=sys.stderr)
        return e.returncode or 1
    _report(result.to_dict(), args.json)
    return 0
