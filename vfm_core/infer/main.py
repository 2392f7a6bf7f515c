"""Generation entry point, one process or one per rank under torchrun::

    torchrun --standalone --nproc-per-node 2 -m vfm_core.infer.main \\
        --checkpoint RUN --text-emb PROMPT.npy --frames 13 --size 64x64 --seed 0 --out a.mp4

Each rank joins a gloo (CPU) or nccl (CUDA) group, builds the same DiT, and denoises its token slice
(:mod:`vfm_core.infer.generate`), or, for an autoregressive run, prefills its share of the token
prompt (``--prompt-tokens``) and samples the same tokens as the others; rank 0 decodes, writes
the files and prints the result as one JSON line. ``--text-emb`` is the prompt's embedding written
by the launcher (``vfm generate --nproc``), so the ranks do not each load the text model;
``--prompt`` alone embeds it here.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np
import torch
import torch.distributed as dist

from vfm_core.errors import UserError
from vfm_core.infer.args import add_generate_args, request_from_args
from vfm_core.infer.generate import generate
from vfm_core.parallel.world import exit_process


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m vfm_core.infer.main")
    add_generate_args(ap)
    ap.add_argument("--text-emb", help="prompt embedding .npy (l, Dt) written by the launcher")
    args = ap.parse_args(argv)
    distributed = int(os.environ.get("WORLD_SIZE", "1")) > 1
    if distributed:
        cuda = torch.cuda.is_available()
        if cuda:
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        dist.init_process_group("nccl" if cuda else "gloo")
    try:
        emb = np.load(args.text_emb, allow_pickle=False) if args.text_emb else None
        result = generate(
            args.checkpoint,
            request_from_args(args),
            args.out,
            tokenizer=args.tokenizer,
            text_emb=emb,
        )
    except (UserError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    finally:
        if distributed:
            dist.destroy_process_group()
    if not distributed or int(os.environ.get("RANK", "0")) == 0:
        print(json.dumps(result.to_dict()), flush=True)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    exit_process(main())  # not sys.exit: see exit_process
