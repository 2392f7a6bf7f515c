"""bf16 training step time and MFU of a reduced-depth paper model on one GPU, through the
trainer's own pieces: the model built on the meta device and materialised (``apply_layout``),
the objective's microbatches (counter-based draws, ``x_in`` / target), forward + backward under
bf16 autocast, AdamW and the sharded EMA. Attention backends: ``sdpa`` (torch's flash kernel) and
``te`` (transformer-engine's fused attention, where installed); FP8 GEMMs on / off
(transformer-engine where installed, else torch's ``_scaled_mm``); each block eager or compiled
(``train.compile``: regional ``torch.compile``; the first two steps, untimed, include compiling).

    python benchmarks/gpu_step.py [--recipe dit-7b] [--depth 4] [--seq 8192 32768] [--steps 5]
        [--attn sdpa te] [--fp8 off auto] [--compile off on]

MFU = training FLOPs per token (``vfm_core.perf.flops``, the model's real depth) x tokens /
step time / the GPU's dense bf16 peak (``vfm_core.perf.hardware``). Prints a table and, with
``--json PATH``, writes the rows. Runs on CPU too (``--device cpu``, for a smoke test only).
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import math
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from vfm_core.config import apply_overrides  # noqa: E402
from vfm_core.data.samples import TrainBatch  # noqa: E402
from vfm_core.families import family_of  # noqa: E402
from vfm_core.models.fp8 import fp8_autocast, resolve_fp8  # noqa: E402
from vfm_core.models.local_attention import set_attention_backend  # noqa: E402
from vfm_core.models.te_adapter import resolve_attention_backend  # noqa: E402
from vfm_core.parallel.apply import apply_layout  # noqa: E402
from vfm_core.parallel.layout import validate_layout  # noqa: E402
from vfm_core.parallel.world import init_world  # noqa: E402
from vfm_core.perf.flops import train_flops_per_token  # noqa: E402
from vfm_core.perf.hardware import peak_flops  # noqa: E402
from vfm_core.recipes import get_recipe  # noqa: E402
from vfm_core.rng import StepRNG  # noqa: E402
from vfm_core.train.ema import EMA  # noqa: E402
from vfm_core.train.optim import build_optimizer  # noqa: E402

LATENT = {8192: (8, 64, 64), 16384: (8, 64, 128), 32768: (8, 128, 128), 65536: (16, 128, 128)}
"""Latent (T, H, W) per sequence length (patch 1x2x2)."""


def run(
    recipe: str, depth: int, seq: int, steps: int, attn: str, fp8: str, compile_: str, device
) -> dict:
    t, h, w = LATENT[seq]
    cfg = apply_overrides(
        get_recipe(recipe),
        [
            f"model.depth={depth}",
            f"model.attn_backend={attn}",
            f"data.latent_frames={t}",
            f"data.latent_height={h}",
            f"data.latent_width={w}",
            "data.batch_size=1",
            "train.dtype=bfloat16",
            f"train.device={device.type}",
            f"train.compile={compile_}",
        ],
    )
    cfg = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, fp8=fp8))
    backend, why = resolve_attention_backend(cfg.model.attn_backend)
    use_fp8, fp8_why = resolve_fp8(cfg.train.fp8, tp=1)
    dims = validate_layout(cfg, 1)
    dims.build_mesh(device.type)
    m = cfg.model
    obj = family_of(cfg).objective(
        cfg,
        draws=StepRNG(seed=1),
        device=device,
        local_batch=1,
        null_text=torch.zeros(m.text_len, m.text_dim),
        null_length=1,
        tensor_parallel=False,
    )
    layout = apply_layout(cfg, dims, device=device, loss_fn=obj.loss, fp8=use_fp8)
    model = set_attention_backend(layout.parts[0], backend)
    params = [p for _, p in layout.named_parameters()]
    opt, _ = build_optimizer(params, cfg.optim, 100)
    ema = EMA(layout.parts, 0.999)
    g = torch.Generator().manual_seed(0)
    batch = TrainBatch(
        values=torch.randn(1, m.in_channels, t, h, w, generator=g) * 0.5,
        text=torch.randn(1, m.text_len, m.text_dim, generator=g),
        text_lengths=torch.full((1,), m.text_len),
        keys=["x"],
        positions=[0],
    )
    grid = (t // m.patch[0], h // m.patch[1], w // m.patch[2])
    tokens = math.prod(grid)
    fpt = train_flops_per_token(m, seq_len=tokens, grid=grid, text_len=m.text_len)
    peak, source = peak_flops(device.type, dtype="bfloat16", width=m.hidden)
    times = []
    for step in range(steps + 2):
        if device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        (mb,) = obj.microbatches(batch, step=step, weight=1.0, splits=1)
        with torch.autocast(device.type, dtype=torch.bfloat16), fp8_autocast(use_fp8):
            loss = obj.loss(model(mb.inputs, **mb.kwargs), mb)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        ema.update()
        if device.type == "cuda":
            torch.cuda.synchronize()
        if step >= 2:  # two warm-up steps
            times.append(time.perf_counter() - t0)
    step_s = statistics.median(times)
    mem = torch.cuda.max_memory_allocated() / 2**30 if device.type == "cuda" else float("nan")
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    return {
        "recipe": recipe,
        "depth": depth,
        "seq": tokens,
        "attention": backend,
        "attention_why": why,
        "fp8": use_fp8,
        "fp8_why": fp8_why,
        "compile": compile_,
        "step_s": step_s,
        "tokens_per_s": tokens / step_s,
        "tflops": fpt * tokens / step_s / 1e12,
        "mfu": fpt * tokens / step_s / peak,
        "peak_mem_gib": mem,
        "loss": loss.item(),
        "peak_source": source,
    }


def _unusable(attn: str, fp8: str) -> str:
    """Why this attention backend / FP8 setting cannot run here ('' if it can)."""
    from vfm_core.config import ConfigError

    try:
        resolve_attention_backend(attn)
    except ConfigError as e:
        return str(e)
    if fp8 != "off":
        used, why = resolve_fp8(fp8, tp=1)
        if not used:
            return f"FP8 {why}"
    return ""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--recipe", default="dit-7b")
    ap.add_argument("--depth", type=int, default=4)
    ap.add_argument("--seq", type=int, nargs="+", default=[8192, 32768], choices=sorted(LATENT))
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--attn", nargs="+", default=["sdpa", "te"])
    ap.add_argument("--fp8", nargs="+", default=["off", "auto"])
    ap.add_argument("--compile", nargs="+", default=["off", "on"], choices=["off", "on"])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    device = torch.device(args.device)
    init_world(device)
    rows = []
    print(
        f"{'seq':>6} {'attention':>9} {'fp8':>5} {'compile':>7} {'step s':>8} {'tokens/s':>9} "
        f"{'TFLOPS':>7} {'MFU':>6} {'mem GiB':>8}  note"
    )
    for seq, attn, fp8, comp in itertools.product(args.seq, args.attn, args.fp8, args.compile):
        head = f"{seq:>6} {attn:>9} {fp8:>5} {comp:>7}"
        why = _unusable(attn, fp8)
        if why:  # say why, spend no time building it
            print(f"{head} not run: {why}"[:200], flush=True)
            continue
        try:
            r = run(args.recipe, args.depth, seq, args.steps, attn, fp8, comp, device)
        except Exception as e:  # one configuration's failure is a row, not the end
            print(f"{head} failed: {type(e).__name__}: {e}"[:300], flush=True)
            continue
        finally:
            torch._dynamo.reset()  # no compiled graph of one row guards the next
        rows.append(r)
        note = "" if r["attention"] == attn else r["attention_why"]
        if fp8 != "off":
            note += f" {r['fp8_why']}"
        print(
            f"{r['seq']:>6} {r['attention']:>9} {'on' if r['fp8'] else 'off':>5} {comp:>7} "
            f"{r['step_s']:>8.3f} {r['tokens_per_s']:>9.0f} {r['tflops']:>7.1f} "
            f"{r['mfu']:>6.1%} {r['peak_mem_gib']:>8.1f}  {note.strip()[:80]}",
            flush=True,
        )
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
