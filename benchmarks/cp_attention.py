"""Context-parallel attention at growing sequence lengths: peak memory and time per rank.

    .venv/bin/python benchmarks/cp_attention.py [--seqs 2048,4096,8192,16384] [--cp 2]
        [--modes ring,causal,packed,alltoall] [--dtype bfloat16] [--json FILE]

One forward + backward of one attention layer (B=1, 4 heads of 64, the issue's shape), the
sequence split over ``--cp`` gloo ranks on this CPU, each mode through the core the trainer swaps
into its attention modules (:class:`vfm_core.parallel.context.ContextParallelAttention`):

* ``ring``: full attention, K/V around the ring; ``causal``: the autoregressive family's causal
  ring over balanced (zigzag) chunks; ``packed``: a THD pack of 3 samples per 2k tokens whose
  samples straddle the chunk boundaries (ring with sample ids); ``alltoall``: Ulysses.

Peak memory is the rise of the rank's resident set during the call: the kernel's high-water mark
(``VmHWM``) reset through ``/proc/self/clear_refs`` just before, minus the resident set then, so
it counts what the call allocates (scores, saved tensors, K/V blocks, gradients) and nothing
before. Without an n x n tensor it grows linearly in the sequence length (the "x prev" column:
~2 per doubling; quadratic would be ~4). Time: wall seconds of the call, median over ranks.
The same script runs on an older checkout (before the attention spec: the ``cp_attention``
callable, taking ``layout`` / ``sample_ids``) for the before/after table.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "parallel"))
from parallel_harness import run_ranks  # noqa: E402  (the tests' one spawning harness)

HEADS, HEAD_DIM = 4, 64


def _rss_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field}")


def _core(group, mode: str):
    """(q, k, v, layout, sample_ids) -> out through the context-parallel attention core."""
    try:
        from vfm_core.models.attention_spec import AttentionSpec
        from vfm_core.parallel.context import ContextParallelAttention
    except ImportError:  # an older checkout: the callable hung on the attention modules
        from vfm_core.parallel.context import cp_attention

        old = cp_attention(group, mode)
        return lambda q, k, v, layout, ids: old(q, k, v, layout=layout, sample_ids=ids)
    core = ContextParallelAttention(group, mode)

    def call(q, k, v, layout, ids):
        groups = None if ids is None else {layout: ids}
        return core(q, k, v, AttentionSpec(layout=layout, groups=groups))

    return call


def _worker(rank, world, mode, seq, dtype_name):
    import torch.distributed as dist

    dtype = getattr(torch, dtype_name)
    n = seq // world
    g = torch.Generator().manual_seed(rank)
    q, k, v = (
        torch.randn(1, HEADS, n, HEAD_DIM, generator=g).to(dtype).requires_grad_() for _ in range(3)
    )
    group = dist.group.WORLD
    fn = _core(group, "alltoall" if mode == "alltoall" else "ring")
    ids = None
    if mode == "packed":  # samples of 700 tokens: several straddle every chunk boundary
        ids = torch.arange(seq) // 700
    layout = "causal" if mode == "causal" else "full"
    warm = [t[:, :, :64].detach().clone().requires_grad_() for t in (q, k, v)]  # imports, first
    fn(*warm, layout, None if ids is None else ids[: 64 * world]).sum().backward()
    dist.barrier()
    Path("/proc/self/clear_refs").write_text("5")  # reset the high-water mark
    base = _rss_kib("VmRSS")
    t0 = time.perf_counter()
    out = fn(q, k, v, layout, ids)
    out.float().sum().backward()
    seconds = time.perf_counter() - t0
    peak = _rss_kib("VmHWM") - base
    dist.barrier()
    return {"seconds": seconds, "peak_mib": peak / 1024}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seqs", default="2048,4096,8192,16384")
    ap.add_argument("--cp", type=int, default=2)
    ap.add_argument("--modes", default="ring,causal,packed,alltoall")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    ap.add_argument("--json", help="also write the rows to this file")
    args = ap.parse_args(argv)
    rows = []
    print(f"CP{args.cp}, B=1, {HEADS} heads x {HEAD_DIM}, {args.dtype}, fwd + bwd, per rank\n")
    print(f"{'mode':9s} {'tokens':>7s} {'peak MiB':>9s} {'x prev':>7s} {'seconds':>8s}")
    for mode in args.modes.split(","):
        prev = None
        for seq in map(int, args.seqs.split(",")):
            res = run_ranks(_worker, args.cp, mode, seq, args.dtype)
            peak = max(r["peak_mib"] for r in res)
            secs = sorted(r["seconds"] for r in res)[len(res) // 2]
            growth = f"{peak / prev:>7.2f}" if prev else f"{'-':>7s}"
            print(f"{mode:9s} {seq:>7d} {peak:>9.1f} {growth} {secs:>8.3f}", flush=True)
            rows.append({"mode": mode, "tokens": seq, "peak_mib": peak, "seconds": secs})
            prev = peak
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
