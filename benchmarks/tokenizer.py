"""Causal video tokenizer: encode/decode throughput and reconstruction PSNR of a short training.

    .venv/bin/python benchmarks/tokenizer.py [--minutes 3] [--sizes 64,128] [--frames 17]
                                             [--out DIR]

Throughput: tok-tiny (4x8x8, 4 latent channels) in eval mode, no grad, batch 1, median of
``--reps`` timed calls after one warm-up, in input (pixel) frames per second; the tiled rows use
``tile_latent_frames=1`` (tiles of 1 + 4 frames, then 4 frames, state carried; equal to untiled).
Training: tok-tiny on synthetic moving shapes (:func:`vfm_core.tokenizer.synthetic_clips`, 32x32,
5 frames, batch 8) for about ``--minutes`` (the step count is set from a measured step time so the
cosine schedule completes), then PSNR on held-out clips at 32x32 and 64x64 against the trivial
mean-colour baseline.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from vfm_core.tokenizer import (
    CausalVideoAutoencoder,
    evaluate_psnr,
    get_tokenizer_config,
    synthetic_clips,
    train_tokenizer,
)


@torch.no_grad()
def throughput(
    model: CausalVideoAutoencoder, frames: int, size: int, reps: int, tile: int
) -> tuple[float, float]:
    """(encode, decode) input frames per second at ``frames`` x ``size`` x ``size``."""
    x = synthetic_clips(1, frames=frames, size=size, seed=0)  # (1, 3, T, H, W)
    z = model.encode(x, tile_latent_frames=tile)
    model.decode(z, tile_latent_frames=tile)

    def timed(fn) -> float:
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        return frames / statistics.median(times)

    enc = timed(lambda: model.encode(x, tile_latent_frames=tile))
    dec = timed(lambda: model.decode(z, tile_latent_frames=tile))
    return enc, dec


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--minutes", type=float, default=3.0, help="training time budget")
    ap.add_argument("--sizes", default="64,128", help="frame sizes for the throughput rows")
    ap.add_argument("--frames", type=int, default=17, help="frames per clip (1 + 4k)")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--out", default=None, help="write the trained tokenizer here")
    args = ap.parse_args()

    cfg = get_tokenizer_config("tok-tiny")
    torch.manual_seed(0)
    model = CausalVideoAutoencoder(cfg).eval()
    params = sum(p.numel() for p in model.parameters())
    print(
        f"tok-tiny: {cfg.temporal_factor}x{cfg.spatial_factor}x{cfg.spatial_factor}, "
        f"{cfg.latent_channels} latent channels, {params / 1e6:.2f}M parameters, "
        f"torch {torch.__version__}, {torch.get_num_threads()} threads\n"
    )
    print("| frames x size | tiling | encode frames/s | decode frames/s |")
    print("|---|---|---|---|")
    for size in (int(s) for s in args.sizes.split(",")):
        for tile in (0, 1):
            enc, dec = throughput(model, args.frames, size, args.reps, tile)
            name = "none" if tile == 0 else "1 + 4, then 4 frames"
            print(f"| {args.frames} x {size}x{size} | {name} | {enc:.1f} | {dec:.1f} |")

    train = [synthetic_clips(8, frames=5, size=32, seed=i) for i in range(200)]
    held32 = [synthetic_clips(8, frames=5, size=32, seed=100_000 + i) for i in range(4)]
    held64 = [synthetic_clips(4, frames=9, size=64, seed=200_000 + i) for i in range(4)]
    _, probe = train_tokenizer(cfg, train, steps=6, lr=args.lr, progress=False)
    step_s = probe.seconds / probe.steps
    steps = max(10, int(args.minutes * 60 / step_s))
    model, m = train_tokenizer(
        cfg,
        train,
        steps=steps,
        lr=args.lr,
        held_out=held32,
        out_dir=args.out,
        max_seconds=args.minutes * 60 * 1.5,
    )
    p64, b64 = evaluate_psnr(model, held64)
    print(f"\ntraining: {m.steps} steps in {m.seconds:.0f} s ({m.train_frames_per_s:.0f} frames/s)")
    print(f"loss {m.loss_first:.4f} (first 10%) -> {m.loss_last:.4f} (last 10%)\n")
    print("| held-out clips | tokenizer PSNR (dB) | mean-colour baseline PSNR (dB) |")
    print("|---|---|---|")
    print(f"| 32 x 32x32 clips of 5 frames (32) | {m.psnr:.2f} | {m.baseline_psnr:.2f} |")
    print(f"| 64 x 64x64 clips of 9 frames (16) | {p64:.2f} | {b64:.2f} |")
    if m.checkpoint:
        print(f"\ncheckpoint: {m.checkpoint}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
