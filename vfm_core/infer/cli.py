"""``vfm generate``: the CLI contract, delegating to :mod:`vfm_core.infer`::

    vfm generate --checkpoint DIR --prompt "..." --frames F --size HxW --seed S --out FILE.mp4
                 [--nproc N] [--steps K] [--guidance G] [--tokenizer PATH]
                 [--max-memory-gib G] [--max-minutes M] [--device-tflops T] [--force]
                 [--temperature T --top-k K --top-p P]                       (autoregressive runs)
                 [--prompt-video PATH | --prompt-tokens FILE] [--prompt-frames K]

Before the text model or any weights load, ``--out`` is checked writable and the request's
memory and time are estimated from the run's config (:mod:`vfm_core.infer.budget`): a request
over a bound is refused in one line (``--force`` runs it anyway, with a warning).

``--nproc 1`` (default) runs in this process. ``--nproc N`` embeds the prompt here (the text model
loads once), then launches ``torchrun --standalone --nproc-per-node N -m vfm_core.infer.main`` so N
context-parallel ranks denoise one video together (same noise, same video as one process). An
autoregressive run's token prompt (``--prompt-tokens`` / ``--prompt-video``) is read and checked
here, before the text model loads, and goes on as ids; N ranks split its prefill and sample the
same tokens as one process.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from vfm_core.infer.args import add_generate_args, request_from_args

__all__ = ["add_parser", "run", "torchrun_argv"]


def add_parser(sub) -> argparse.ArgumentParser:
    g = sub.add_parser("generate", help="text -> video with a trained DiT (CP over --nproc ranks)")
    add_generate_args(g)
    g.add_argument("--nproc", type=int, default=1, help="context-parallel ranks (torchrun)")
    g.add_argument("--json", action="store_true", help="print the result as one JSON object")
    return g


def torchrun_argv(
    nproc: int, args: argparse.Namespace, text_emb: str, prompt_ids: str | None = None
) -> list[str]:
    """``python -m torch.distributed.run`` command for ``nproc`` generation ranks;
    ``prompt_ids``: the checked token prompt (K, h, w) .npy of an autoregressive run."""
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    argv += [f"--nproc-per-node={nproc}", "-m", "vfm_core.infer.main"]
    argv += ["--checkpoint", str(args.checkpoint), "--prompt", args.prompt]
    argv += ["--frames", str(args.frames), "--size", args.size, "--seed", str(args.seed)]
    argv += ["--out", str(args.out), "--fps", str(args.fps), "--text-emb", text_emb]
    argv += ["--temperature", repr(args.temperature), "--top-k", str(args.top_k)]
    argv += ["--top-p", repr(args.top_p)]
    if prompt_ids is not None:
        argv += ["--prompt-tokens", prompt_ids, "--prompt-frames", str(args.prompt_frames)]
    argv += ["--max-minutes", repr(args.max_minutes)]
    for flag in ("steps", "guidance", "tokenizer", "max_memory_gib", "device_tflops"):
        if getattr(args, flag) is not None:
            argv += [f"--{flag.replace('_', '-')}", str(getattr(args, flag))]
    if args.no_gif:
        argv.append("--no-gif")
    if args.force:
        argv.append("--force")
    return argv


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
    """Run ``vfm generate``; user errors raise GenerateError / CheckpointError (exit 2 upstream)."""
    from vfm_core.config import ConfigError, load_yaml, validate
    from vfm_core.infer.dit_checkpoint import read_text_record, resolve_checkpoint
    from vfm_core.infer.generate import embed_prompt, generate
    from vfm_core.infer.request import ar_prompt_ids, check_guidance, check_prompt, preflight
    from vfm_core.infer.shapes import GenerateError
    from vfm_core.infer.video_out import check_writable
    from vfm_core.train.checkpoint import CheckpointError

    # cheap checks first, before the text model, the weights and the ranks are loaded/started
    request = request_from_args(args)
    check_prompt(args.prompt)
    if args.guidance is not None:
        check_guidance(args.guidance)
    if args.nproc < 1:
        raise GenerateError(f"--nproc: must be >= 1, got {args.nproc}")
    check_writable(args.out)
    run_dir, _ = resolve_checkpoint(args.checkpoint, check=False)  # verified when loaded
    try:
        cfg = validate(load_yaml(run_dir / "config.yaml"))
    except ConfigError as e:
        raise CheckpointError(f"--checkpoint {run_dir}: {e}") from None
    # the plan and its estimated memory / time against the bounds, from the config alone
    preflight(cfg, request, tokenizer=args.tokenizer, world=args.nproc)
    ids = None  # an autoregressive run's token prompt (K, h, w), read and checked here
    if args.prompt_tokens or args.prompt_video:
        ids = ar_prompt_ids(cfg, request, tokenizer=args.tokenizer)
    # (l, Dt) as the run's captions were embedded (RUN/text.json); empty prompt -> GenerateError
    emb = embed_prompt(args.prompt, record=read_text_record(run_dir))
    with tempfile.TemporaryDirectory(prefix="vfm-generate-") as tmp:
        path, ids_path = str(Path(tmp) / "prompt.npy"), str(Path(tmp) / "prompt.tokens.npy")
        if ids is not None:  # the checked ids go on as the prompt (a video is encoded once)
            np.save(ids_path, ids, allow_pickle=False)
            request.prompt_tokens, request.prompt_video = ids_path, None
        if args.nproc == 1:
            result = generate(
                args.checkpoint, request, args.out, tokenizer=args.tokenizer, text_emb=emb
            )
            _report(result.to_dict(), args.json)
            return 0
        np.save(path, emb, allow_pickle=False)
        argv = torchrun_argv(args.nproc, args, path, ids_path if ids is not None else None)
        proc = subprocess.run(argv, stdout=subprocess.PIPE, text=True)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        print(
            f"vfm generate: error: {args.nproc} ranks failed (exit {proc.returncode})",
            file=sys.stderr,
        )
        return proc.returncode or 1
    _report(json.loads(lines[-1]), args.json)
    return 0
