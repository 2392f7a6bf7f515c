"""vfm side by side with the public reference implementations, at matched configurations.

    .venv/bin/python benchmarks/peers.py --dit-repo DIR --nanogpt-repo DIR [--rounds 5]
        [--steps 2] [--width 512] [--clips 48] [--threads 1] [--only dit,ar,loader,gen]
        [--compile] [--device cpu|cuda] [--dtype float32|bfloat16] [--json]

One process, CPU fp32, one intra-op thread by default (on a shared machine a second OpenMP
thread waits at every op's barrier for a free core: measured on 2 cores at load 11, a
(4, 192, 64) multiply took 38 ms and a width-64 AR step 2-15 s, against 0.1 s with one thread;
``--threads 0`` keeps torch's default). The contestants of a section are interleaved in every
round (the order reversed every other round, so a drift of the machine's speed hits all sides
alike); a ratio is vfm / peer of the same round, reported as the median over rounds with min
and max. The peers' source is imported from the local checkouts given (never vendored); a
comparison whose checkout is not given is skipped with one line.

1. DiT, plain loop (zero_grad, forward, MSE against a random target, backward, AdamW step;
   batch 8 of 4x32x32 latents, patch 2 -> 256 tokens/sample, depth 4, width W, W/64 heads):
   vfm's DiT vs facebookresearch/DiT ``DiT`` (class labels, AdaLN-Zero), twice: as its recipe
   has it (``recipe``: dit-tiny, text cross-attention over ``model.text_len`` tokens, QK-norm,
   3D RoPE, AdaLN-LoRA: ~16% more FLOPs per token than the peer) and at the peer's
   configuration (``matched``: ``model.text_conditioning=pooled`` — the caption's mean token
   added to the timestep embedding as DiT adds its class embedding —, no QK norm, AdaLN-Zero,
   absolute positions only: ``model.rope=false``, as DiT's fixed sin-cos), and ``matched + 3D
   RoPE`` (the recipe's RoPE back on top: its cost, a plain-loop row). ``recipe pooled``: the
   recipe's architecture (QK norm, 3D RoPE, AdaLN-LoRA, its norms and MLP) with the caption
   pooled as in ``matched`` (``model.text_conditioning=pooled``): the peer's FLOPs per token done
   by the recipe's blocks, so its ratio is the recipe architecture's speed per FLOP.
2. The same models through vfm's ``Trainer.train_step`` (EDM objective, its AdamW, clipping,
   schedule): the recipe, recipe pooled and matched trainers vs the peer's plain loop, and
   vfm's trainer vs vfm's plain loop (whose AdamW is torch's default, the for-loop on CPU, like
   the peers').
3. Autoregressive: vfm's causal video transformer (recipe ar-tiny with kv_heads = heads, i.e.
   multi-head like the peer; grid 3x8x8 = 192 tokens, vocab 1000, batch 4, next-token loss)
   vs karpathy/nanoGPT ``GPT`` with its own loss and ``configure_optimizers``; ``recipe``
   (SwiGLU, RMSNorm, cross-attention to the caption, QK norm, 3D RoPE) and ``matched``
   (nanoGPT's exact-GELU MLP without biases and LayerNorm, pooled caption, no QK norm, learned
   absolute positions without RoPE; nanoGPT has no text at all), each in a plain loop and
   through vfm's trainer (next-token objective), ``recipe pooled`` and ``matched + 3D RoPE``, as
   the DiT rows.
4. Loader, decode on, batches of 8 over the same tars (``--clips`` synthetic H.264 clips made
   by ``benchmarks/loader.py``'s ``make_dataset``): vfm's shard loader (checksums on, its
   defaults) with 0 reader threads (its default) and with 2 vs ``webdataset.WebDataset`` +
   PyAV decode of every sample's mp4 to uint8 frames (+ its json and text embedding).

5. Generation (``gen``): vfm's DiT sampler (24 Heun steps, guidance 3 in one batch) against a
   bare loop of exactly the model calls it made, replayed (the sampler's overhead); the
   autoregressive ``sample_tokens`` with its KV cache, and without it, beside nanoGPT's
   ``generate`` (no cache) at the same size — tokens generated per second.

Memory: constructing vfm's ``Trainer`` on the CPU fixes glibc's malloc thresholds for the
process (``vfm_core/perf/cpu_memory.py``), so every contestant of the race, the peers too, runs
with freed memory kept mapped between steps.

FLOPs per token: ``torch.utils.flop_counter.FlopCounterMode`` over one training step with
SDPA restricted to its math backend (the CPU flash kernel has no FLOP formula in torch 2.13
and would count 0); it counts matmuls, convolutions and attention only, so the optimizer adds
nothing: the count is that of forward + backward. Top ops: ``torch.profiler`` of one step by
self CPU time (models); ``cProfile`` by own time for the loaders, whose work is Python and
PyAV, not aten ops. ``--device cuda --dtype bfloat16``: the same table on a GPU, every forward
under bf16 autocast (the peers' as nanoGPT's train.py runs it, nanoGPT with its fused AdamW),
the clock read after a device synchronise, top ops by self device time. The contestants (and
the peers' source, with a stand-in for timm where DiT's import of it fails) are built in
``benchmarks/peer_contestants.py``.
"""

from __future__ import annotations

import argparse
import cProfile
import importlib.util
import json
import os
import pstats
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.profiler import ProfilerActivity, profile
from torch.utils.flop_counter import FlopCounterMode

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.peer_contestants import (  # noqa: E402
    Contestant,
    ar_contestants,
    ar_generate_contestants,
    commit,
    dit_contestants,
    ensure_timm,
    load_peer,
    loader_contestants,
    sampler_contestants,
)

SECTIONS = ("dit", "ar", "loader", "gen")


# ------------------------------------------------------------------------ measurement
def sync() -> None:
    """Wait for the GPU's queued work (a no-op on CPU), so a clock read covers it."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


def race(
    cs: list[Contestant], rounds: int, steps: int, warmup: int
) -> tuple[dict[str, list[float]], dict[str, float]]:
    """(units/s of every contestant per round, seconds of its untimed warm-up steps); within a
    round each runs ``steps`` steps. A compiled contestant compiles in its warm-up (forward and
    backward of the first step), so the rates are steady state and the warm-up is reported
    apart."""
    warm: dict[str, float] = {}
    for c in cs:
        sync()
        t0 = time.perf_counter()
        for _ in range(warmup):
            c.step()
        sync()
        warm[c.name] = time.perf_counter() - t0
    rates: dict[str, list[float]] = {c.name: [] for c in cs}
    for r in range(rounds):
        for c in cs if r % 2 == 0 else cs[::-1]:
            sync()
            t0 = time.perf_counter()
            for _ in range(steps):
                c.step()
            sync()
            rates[c.name].append(steps * c.units / (time.perf_counter() - t0))
    return rates, warm


def flops_per_unit(c: Contestant) -> float:
    """FLOPs of one step (forward + backward: see the module docstring) per token."""
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as fc:
        c.step()
    return fc.get_total_flops() / c.units


def top_ops(c: Contestant, model: bool, k: int = 5) -> list[dict]:
    """The ``k`` ops (torch.profiler, models: by self CPU time, on a GPU by self device time)
    or functions (cProfile, loaders) of one step with the most self time. Models: the step
    profiled follows one unprofiled step of the same contestant (measured on the recipe
    trainer: its step profiled right after the other contestants' rounds took 2x the
    element-wise time of the next one, ``aten::mul`` 77 ms vs 39 ms, its plain loop's 40 ms;
    that had read as a trainer overhead, 9% ``aten::mul``, which the timed rounds do not show)."""
    if model:
        c.step()
        sync()
        gpu = torch.cuda.is_available() and torch.cuda.is_initialized()
        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if gpu else [])
        with profile(activities=acts) as prof:
            c.step()
            sync()
        events = prof.key_averages()
        attr = "self_device_time_total" if gpu else "self_cpu_time_total"
        total = sum(getattr(e, attr) for e in events) or 1.0
        top = sorted(events, key=lambda e: getattr(e, attr), reverse=True)[:k]
        return [
            {"op": e.key, "ms": getattr(e, attr) / 1e3, "share": getattr(e, attr) / total}
            for e in top
        ]
    pr = cProfile.Profile()
    pr.runcall(c.step)
    st = pstats.Stats(pr).stats  # {(file, line, fn): (cc, nc, tottime, cumtime, callers)}
    total = sum(v[2] for v in st.values()) or 1.0
    top = sorted(st.items(), key=lambda kv: kv[1][2], reverse=True)[:k]
    return [
        {"op": f"{Path(f).name}:{fn}", "ms": v[2] * 1e3, "share": v[2] / total}
        for (f, _, fn), v in top
    ]


def say(line: str) -> None:
    """A progress line on stderr (the report goes to stdout at the end)."""
    print(f"[peers {time.strftime('%H:%M:%S')}] {line}", file=sys.stderr, flush=True)


def measure(cs: list[Contestant], args: argparse.Namespace, steps: int, model: bool) -> dict:
    say(f"racing {len(cs)} contestants: {', '.join(c.name for c in cs)}")
    rates, warm = race(cs, args.rounds, steps, warmup=args.warmup)
    say("counting FLOPs and profiling one step each")
    res = {}
    fpus: dict[str, float | None] = {}
    for c in cs:  # a compiled contestant does the FLOPs of its eager twin (listed before it)
        twin = c.name.removesuffix(" compiled")
        fpus[c.name] = fpus[twin] if twin in fpus else (flops_per_unit(c) if model else None)
    for c in cs:
        fpu = fpus[c.name]
        rate = statistics.median(rates[c.name])
        res[c.name] = {
            "unit": c.unit,
            "units": c.units,
            "rate": rate,
            "rates": rates[c.name],
            "warmup_s": warm[c.name],  # compiled contestants: compiling, not in the rates
            "flops_per_unit": fpu,
            "gflops_s": fpu * rate / 1e9 if fpu else None,
            "top_ops": top_ops(c, model),
        }
    return res


def compare(label: str, a: str, b: str, res: dict) -> dict:
    ratios = [x / y for x, y in zip(res[a]["rates"], res[b]["rates"])]
    return {
        "row": label,
        "vfm": a,
        "peer": b,
        "ratio": statistics.median(ratios),
        "ratio_min": min(ratios),
        "ratio_max": max(ratios),
    }


def model_rows(family: str, peer: str | None, res: dict, args: argparse.Namespace) -> list[dict]:
    """The rows of a model section: vfm's plain loop and its trainer (recipe, recipe pooled,
    matched; plain loop also matched + 3D RoPE) against the peer's loop (where the peer ran),
    vfm's trainer against its own plain loop, and with ``--compile`` the same for the compiled
    contestants."""
    vfm = f"vfm {family}"
    rows = []
    if peer is not None:
        rows += [
            (f"{family} plain loop, recipe", f"{vfm} plain", peer),
            (f"{family} plain loop, recipe pooled", f"{vfm} plain pooled", peer),
            (f"{family} plain loop, matched", f"{vfm} plain matched", peer),
            (f"{family} plain loop, matched + 3D RoPE", f"{vfm} plain matched + RoPE", peer),
            (f"{family} trainer vs peer loop, recipe", f"{vfm} trainer", peer),
            (f"{family} trainer vs peer loop, recipe pooled", f"{vfm} trainer pooled", peer),
            (f"{family} trainer vs peer loop, matched", f"{vfm} trainer matched", peer),
        ]
    rows += [
        (f"vfm {family} trainer / plain, recipe", f"{vfm} trainer", f"{vfm} plain"),
        (
            f"vfm {family} trainer / plain, recipe pooled",
            f"{vfm} trainer pooled",
            f"{vfm} plain pooled",
        ),
        (
            f"vfm {family} trainer / plain, matched",
            f"{vfm} trainer matched",
            f"{vfm} plain matched",
        ),
    ]
    out = [compare(label, a, b, res) for label, a, b in rows]
    for label, a, b in rows if args.compile else ():
        b = b + " compiled" if b.startswith("vfm") else b
        out.append(compare(label + ", compiled", a + " compiled", b, res))
    return out


# ------------------------------------------------------------------------ report
def print_report(out: dict) -> None:
    cfg = out["config"]
    if not out["rows"]:
        return
    where = (
        f"{cfg['gpu']} {cfg['dtype']}"
        if cfg["device"] == "cuda"
        else f"CPU {cfg['dtype']}, {cfg['threads']} thread(s), {cfg['cores']} cores at load "
        f"{cfg['load_avg']:.1f}"
    )
    print(
        f"\n## vfm vs peers (torch {cfg['torch']}, {where}, width {cfg['width']}, "
        f"{cfg['rounds']} rounds x {cfg['steps']} steps)"
    )
    print(
        "| row | vfm | peer | unit | vfm /s | peer /s | vfm/peer median (min-max) | "
        "vfm MFLOP/tok | peer MFLOP/tok | vfm GFLOP/s | peer GFLOP/s |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    c = out["contestants"]
    f = lambda v, s: "-" if v is None else format(v, s)  # noqa: E731
    for r in out["rows"]:
        a, b = c[r["vfm"]], c[r["peer"]]
        print(
            f"| {r['row']} | {r['vfm']} | {r['peer']} | {a['unit']} | {a['rate']:.0f} | "
            f"{b['rate']:.0f} | {r['ratio']:.3f} ({r['ratio_min']:.3f}-{r['ratio_max']:.3f}) | "
            f"{f(a['flops_per_unit'] and a['flops_per_unit'] / 1e6, '.1f')} | "
            f"{f(b['flops_per_unit'] and b['flops_per_unit'] / 1e6, '.1f')} | "
            f"{f(a['gflops_s'], '.1f')} | {f(b['gflops_s'], '.1f')} |"
        )
    compiled = {n: v for n, v in c.items() if n.endswith(" compiled")}
    if compiled and cfg["warmup"]:
        print(f"\ncompile time (the {cfg['warmup']} untimed warm-up step(s), not in the rates)")
        for name, v in compiled.items():
            eager = c.get(name.removesuffix(" compiled"), {}).get("warmup_s")
            print(
                f"- {name}: {v['warmup_s']:.1f} s"
                + ("" if eager is None else f" (eager twin's warm-up {eager:.1f} s)")
                + f", steady step {v['units'] / v['rate']:.2f} s"
            )
    clock = "device" if cfg["device"] == "cuda" else "CPU"
    print(f"\ntop 5 by self {clock} time of one step (models: torch.profiler; loaders: cProfile)")
    for name, v in c.items():
        ops = ", ".join(f"{o['op']} {o['share']:.0%}" for o in v["top_ops"])
        print(f"- {name}: {ops}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dit-repo", help="checkout of facebookresearch/DiT (its models.py)")
    ap.add_argument("--nanogpt-repo", help="checkout of karpathy/nanoGPT (its model.py)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=2, help="model steps per contestant per round")
    ap.add_argument("--warmup", type=int, default=1, help="untimed steps per contestant")
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads (0: default)")
    ap.add_argument("--width", type=int, default=512, help="model width (heads: width / 64)")
    ap.add_argument("--clips", type=int, default=48, help="loader: clips (one epoch per round)")
    ap.add_argument("--only", default=",".join(SECTIONS), help="comma list of dit, ar, loader, gen")
    ap.add_argument(
        "--compile",
        action="store_true",
        help="also race vfm with each block compiled (train.compile=on; minutes of compiling)",
    )
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument(
        "--dtype", default="float32", choices=["float32", "bfloat16"], help="bfloat16: autocast"
    )
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        ap.error("--device cuda: no CUDA device here")
    only = set(args.only.split(","))
    if bad := only - set(SECTIONS):
        ap.error(f"--only: unknown section(s) {sorted(bad)} (choose from {', '.join(SECTIONS)})")
    if args.width % 64:
        ap.error(f"--width {args.width}: must be a multiple of 64 (heads of 64 channels)")
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    out: dict = {
        "config": {
            "torch": torch.__version__,
            "threads": torch.get_num_threads(),
            "load_avg": os.getloadavg()[0],
            "cores": os.cpu_count(),
            "gpu": torch.cuda.get_device_name() if args.device == "cuda" else None,
            **{k: v for k, v in vars(args).items() if k != "json"},
        },
        "rows": [],
        "contestants": {},
        "skipped": [],
    }

    def skip(line: str) -> None:
        print(f"skipped: {line}")
        out["skipped"].append(line)

    if "dit" in only:
        dit = None
        if args.dit_repo:
            ensure_timm()
            dit = load_peer(args.dit_repo, "models.py", "peer_dit_models", "--dit-repo")
            out["config"]["dit_commit"] = commit(args.dit_repo)
        else:
            skip("DiT vs facebookresearch/DiT (no --dit-repo); vfm trainer vs plain loop only")
        res = measure(dit_contestants(args, dit), args, args.steps, model=True)
        out["contestants"].update(res)
        out["rows"] += model_rows("DiT", "facebookresearch/DiT" if dit else None, res, args)
    if "ar" in only:
        if args.nanogpt_repo:
            gpt = load_peer(args.nanogpt_repo, "model.py", "peer_nanogpt_model", "--nanogpt-repo")
            out["config"]["nanogpt_commit"] = commit(args.nanogpt_repo)
            res = measure(ar_contestants(args, gpt), args, args.steps, model=True)
            out["contestants"].update(res)
            out["rows"] += model_rows("AR", "karpathy/nanoGPT", res, args)
        else:
            skip("AR vs karpathy/nanoGPT (no --nanogpt-repo)")
    if "loader" in only:
        if importlib.util.find_spec("webdataset") is None:
            skip("loader vs webdataset+PyAV (webdataset not installed)")
        else:
            from benchmarks.loader import make_dataset

            with tempfile.TemporaryDirectory(prefix="vfm-peers-") as tmp:
                shards = make_dataset(Path(tmp), args.clips)
                cs = loader_contestants(shards)
                res = measure(cs, args, max(1, args.clips // 8), model=False)
            out["contestants"].update(res)
            for w in (0, 2):
                row = f"loader, {w} workers" + (" (default)" if w == 0 else "")
                out["rows"].append(compare(row, f"vfm loader w{w}", "webdataset+PyAV", res))
    if "gen" in only:
        res = measure(sampler_contestants(args), args, 1, model=False)
        out["contestants"].update(res)
        out["rows"].append(
            compare(
                "DiT sampler / bare model calls",
                "vfm DiT sampler",
                "bare loop of its model calls",
                res,
            )
        )
        gpt = None
        if args.nanogpt_repo:
            gpt = load_peer(args.nanogpt_repo, "model.py", "peer_nanogpt_model", "--nanogpt-repo")
        else:
            skip("AR generation vs karpathy/nanoGPT generate (no --nanogpt-repo)")
        res = measure(ar_generate_contestants(args, gpt), args, 1, model=False)
        out["contestants"].update(res)
        cached, plain = "vfm AR sample_tokens (KV cache)", "vfm AR sample_tokens (no cache)"
        out["rows"].append(compare("AR generation, KV cache / none", cached, plain, res))
        if gpt is not None:
            peer = "karpathy/nanoGPT generate"
            out["rows"].append(compare("AR generation, KV cache vs nanoGPT", cached, peer, res))
            out["rows"].append(compare("AR generation, no cache vs nanoGPT", plain, peer, res))
    if args.json:
        print(json.dumps(out, indent=1))
    else:
        print_report(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
