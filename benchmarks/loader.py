"""Loader benchmark: padding with packing vs pad-to-max, loader throughput, bytes read per rank
with and without model-parallel read-then-gather, time to the first batch after a restore.

    python benchmarks/loader.py [--samples 20000] [--clips 96] [--out DIR] [--json] [--s3]

1. Padding on a realistic mixed length distribution (metadata only, 20k samples): 25% images
   (256², 512x512, 432x768), 75% clips of 1–8 s at 16 fps at 256x256, 320x576 or 480x848;
   tokenizer 4x8x8, patch 1x2x2, ``max_tokens`` 65536. Packed = the loader's planner (buffered
   FFD, buffer 64, slack 3%); naive = every sample padded to ``max_tokens`` (one per sequence),
   and batches of 8 padded to their longest sample.
2. Loader alone on real shards of synthetic H.264 clips (decode on): samples/s and tokens/s,
   0 and 2 reader threads, unpacked and packed.
3. Bytes read per rank: a model-parallel group of k=2 (gloo, 2 processes) reading 1/k each and
   all-gathering vs each rank reading the whole batch.
4. Time to first batch after restore: new loader (index read + size check) + load_state_dict +
   next_batch, after 20 steps.
5. Integrity check cost: samples/s with the default check (``verify="sample"``: shard sizes at
   start, every sample's sha256 against the index as it is read) vs off (``verify="size"``),
   decode on (what training pays) and off (the worst case: nothing else to hide it behind);
   the two loaders alternate in rounds (A B A B ...) and the medians are reported, since this
   machine's speed drifts within a run. ``--only integrity`` runs this section alone.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

MAX_TOKENS = 65536


def token_count(frames: int, h: int, w: int) -> int:
    t = 1 + (frames - 1) // 4
    return t * (h // 8 // 2) * (w // 8 // 2)


def mixed_lengths(n: int, seed: int = 0) -> list[int]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        if rng.random() < 0.25:
            h, w = [(256, 256), (512, 512), (432, 768)][rng.integers(3)]
            out.append(token_count(1, h, w))
        else:
            h, w = [(256, 256), (320, 576), (480, 848)][rng.integers(3)]
            seconds = rng.uniform(1, 8)
            out.append(token_count(int(seconds * 16) + 1, h, w))
    return out


def padding_bench(n: int) -> dict:
    from vfm_core.data.plan import GlobalOrder, Planner

    lengths = mixed_lengths(n)
    order = GlobalOrder(n, seed=0)
    planner = Planner(order, lengths.__getitem__, batch_size=1, max_tokens=MAX_TOKENS)
    used = packs = 0
    t0 = time.perf_counter()
    while planner.state.position < n:
        (groups,) = planner.next_step(1)
        used += sum(lengths[order.sample(p)] for p in groups[0])
        packs += 1
    plan_s = time.perf_counter() - t0
    # finish the epoch: what is left in the queue/buffer belongs to epoch 0
    rest = planner.state.queue + ([planner.state.buffer] if planner.state.buffer else [])
    for g in rest:
        used += sum(lengths[order.sample(p)] for p in g if p < n)
        packs += 1
    total = sum(lengths)
    batch_max = 0
    perm = order.perm(0)
    for i in range(0, n, 8):
        chunk = [lengths[j] for j in perm[i : i + 8]]
        batch_max += max(chunk) * len(chunk)
    return {
        "samples": n,
        "tokens": total,
        "mean_tokens": total / n,
        "packs": packs,
        "padding_packed": 1 - total / (packs * MAX_TOKENS),
        "padding_pad_to_max_tokens": 1 - total / (n * MAX_TOKENS),
        "padding_pad_to_batch_max_b8": 1 - total / batch_max,
        "plan_s": plan_s,
    }


def make_dataset(root: Path, n: int) -> Path:
    import pandas as pd

    from vfm_core.data.shards import ShardWriterConfig, write_shards
    from vfm_core.video.synthetic import Segment, VideoSpec, make_video

    shapes = [(1, 64, 64), (17, 64, 64), (33, 64, 96), (9, 96, 64), (1, 96, 128), (25, 64, 64)]
    (root / "clips").mkdir(parents=True, exist_ok=True)
    rows = []
    for i in range(n):
        f, h, w = shapes[i % len(shapes)]
        spec = VideoSpec(width=w, height=h, fps=16.0, seed=i, segments=(Segment(n_frames=f),))
        make_video(root / "clips" / f"c{i:04d}.mp4", spec)
        rows.append(
            {
                "clip_id": f"c{i:04d}",
                "uri": f"clips/c{i:04d}.mp4",
                "caption": f"clip {i}",
                "n_frames": f,
                "height": h,
                "width": w,
            }
        )
    rng = np.random.default_rng(0)
    embed = lambda caps: rng.standard_normal((len(caps), 384)).astype(np.float32)  # noqa: E731
    write_shards(
        pd.DataFrame(rows),
        str(root / "shards"),
        embed=embed,
        base_url=str(root),
        config=ShardWriterConfig(target_shard_bytes=1 << 20),
    )
    return root / "shards"


def throughput(shards: Path | str, steps: int) -> list[dict]:
    from vfm_core.data.loader import build_loader

    rows = []
    for mode, kw in (("unpacked B=8", {"batch_size": 8}), ("packed 4096", {"max_tokens": 4096})):
        for workers in (0, 2):
            ld = build_loader(shards=str(shards), seed=0, num_workers=workers, **kw)
            ld.next_batch()  # warm-up (imports, first decode)
            n = toks = 0
            t0 = time.perf_counter()
            for _ in range(steps):
                b = ld.next_batch()
                n += len(b.samples)
                toks += sum(s.grid[0] * s.grid[1] * s.grid[2] for s in b.samples)
            dt = time.perf_counter() - t0
            ld.close()
            rows.append(
                {
                    "mode": mode,
                    "workers": workers,
                    "samples_s": n / dt,
                    "tokens_s": toks / dt,
                    "MB_s": ld.bytes_read / dt / 1e6,
                }
            )
    return rows


def integrity_cost(shards: Path | str, steps: int, rounds: int = 9) -> list[dict]:
    """Median samples/s with the per-sample checksum on vs off, interleaved rounds."""
    from vfm_core.data.index import read_index
    from vfm_core.data.loader import build_loader
    from vfm_core.data.shard_reader import read_raw, sample_checksum

    index = read_index(str(shards))  # the check alone, timed without the loader around it
    raws = [read_raw(index, i) for i in range(len(index))]
    mean_bytes = float(np.mean([len(r) for r in raws]))
    t0 = time.perf_counter()
    for _ in range(20):
        for r in raws:
            sample_checksum(r)
    hash_us = (time.perf_counter() - t0) / (20 * len(raws)) * 1e6
    rows = []
    for decode in ("frames", "none"):
        rates: dict[str, list[float]] = {"sample": [], "size": []}
        loaders = {
            v: build_loader(shards=str(shards), seed=0, batch_size=8, decode=decode, verify=v)
            for v in rates
        }
        for ld in loaders.values():
            ld.next_batch()  # warm-up
        for _ in range(rounds):
            n = dict.fromkeys(rates, 0)
            dt = dict.fromkeys(rates, 0.0)
            for _ in range(steps):  # A B A B ... step by step: both see the same drift
                for verify, ld in loaders.items():
                    t0 = time.perf_counter()
                    n[verify] += len(ld.next_batch().samples)  # the same samples for both
                    dt[verify] += time.perf_counter() - t0
            for verify in rates:
                rates[verify].append(n[verify] / dt[verify])
        for ld in loaders.values():
            ld.close()
        on, off = np.median(rates["sample"]), np.median(rates["size"])
        ratio = np.median(np.array(rates["sample"]) / np.array(rates["size"]))
        rows.append(
            {
                "decode": decode,
                "checksum_us_per_sample": hash_us,
                "mean_sample_bytes": mean_bytes,
                "rounds": rounds,
                "steps": steps,
                "on_samples_s": float(on),
                "off_samples_s": float(off),
                "on_over_off": float(ratio),
                "spread_on": [float(min(rates["sample"])), float(max(rates["sample"]))],
                "spread_off": [float(min(rates["size"])), float(max(rates["size"]))],
            }
        )
    return rows


def print_integrity(rows: list[dict]) -> None:
    r0 = rows[0]
    print("\n## integrity check cost (per-sample sha256 on vs off, B=8, 0 workers)")
    print(
        f"the check alone: {r0['checksum_us_per_sample']:.1f} us per sample of "
        f"{r0['mean_sample_bytes'] / 1e3:.1f} kB on average"
    )
    print("| decode | check on samples/s | check off samples/s | on/off (median of rounds) |")
    print("|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['decode']} | {r['on_samples_s']:.1f} ({r['spread_on'][0]:.0f}-"
            f"{r['spread_on'][1]:.0f}) | {r['off_samples_s']:.1f} ({r['spread_off'][0]:.0f}-"
            f"{r['spread_off'][1]:.0f}) | {r['on_over_off']:.3f} |"
        )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _mp_rank(rank: int, world: int, port: int, shards: str, out: str, steps: int) -> None:
    import torch.distributed as dist

    from vfm_core.data.loader import build_loader

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timedelta(seconds=120))
    ld = build_loader(shards=shards, seed=0, batch_size=8, mp_group=dist.group.WORLD)
    t0 = time.perf_counter()
    for _ in range(steps):
        ld.next_batch()
    dt = time.perf_counter() - t0
    Path(out, f"rank{rank}.json").write_text(json.dumps({"bytes": ld.bytes_read, "s": dt}))
    dist.barrier()
    dist.destroy_process_group()
    from vfm_core.parallel.world import exit_process

    exit_process(0)  # a gloo worker thread may outlive finalisation (see exit_process)


def bytes_per_rank(shards: Path, steps: int, tmp: Path) -> dict:
    import torch.multiprocessing as mp

    from vfm_core.data.loader import build_loader

    k = 2
    mp.spawn(_mp_rank, args=(k, _free_port(), str(shards), str(tmp), steps), nprocs=k)
    ranks = [json.loads((tmp / f"rank{r}.json").read_text()) for r in range(k)]
    solo = build_loader(shards=str(shards), seed=0, batch_size=8)
    t0 = time.perf_counter()
    for _ in range(steps):
        solo.next_batch()
    return {
        "k": k,
        "steps": steps,
        "bytes_per_rank_gather": [r["bytes"] for r in ranks],
        "bytes_per_rank_no_gather": solo.bytes_read,
        "s_gather": max(r["s"] for r in ranks),
        "s_no_gather": time.perf_counter() - t0,
    }


def restore_latency(shards: Path | str) -> dict:
    from vfm_core.data.loader import build_loader

    out = {}
    for mode, kw in (("unpacked", {"batch_size": 8}), ("packed", {"max_tokens": 4096})):
        ld = build_loader(shards=str(shards), seed=0, **kw)
        for _ in range(20):
            ld.next_batch()
        state = json.dumps(ld.state_dict())
        t0 = time.perf_counter()
        again = build_loader(shards=str(shards), seed=0, **kw)
        again.load_state_dict(json.loads(state))
        again.next_batch()
        out[mode] = {"first_batch_s": time.perf_counter() - t0, "state_bytes": len(state)}
    return out


def upload_to_moto(shards: Path) -> str:
    """Start moto's S3 server on loopback (kept for this process) and copy the shards there."""
    import boto3
    from moto.server import ThreadedMotoServer

    from vfm_core import storage

    port = _free_port()
    ThreadedMotoServer(ip_address="127.0.0.1", port=port).start()
    os.environ.update(
        AWS_ENDPOINT_URL=f"http://127.0.0.1:{port}",
        AWS_ACCESS_KEY_ID="bench",
        AWS_SECRET_ACCESS_KEY="bench",
        AWS_DEFAULT_REGION="us-east-1",
    )
    boto3.client("s3").create_bucket(Bucket="bench")
    for f in sorted(shards.iterdir()):
        storage.put_file(f, f"s3://bench/shards/{f.name}")
    return "s3://bench/shards"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--samples", type=int, default=20000)
    ap.add_argument("--clips", type=int, default=96)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--out", default="")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--s3", action="store_true", help="also: loader over moto S3 on 127.0.0.1")
    ap.add_argument("--only", choices=("integrity",), help="run one section alone")
    ap.add_argument("--rounds", type=int, default=9, help="integrity: alternating rounds")
    args = ap.parse_args()
    tmp = Path(args.out or tempfile.mkdtemp(prefix="vfm-loader-bench-"))
    if args.only == "integrity":
        rows = integrity_cost(make_dataset(tmp, args.clips), args.steps, args.rounds)
        if args.json:
            print(json.dumps(rows, indent=1))
        else:
            print_integrity(rows)
        return
    res: dict = {"padding": padding_bench(args.samples)}
    shards = make_dataset(tmp, args.clips)
    res["throughput"] = throughput(shards, args.steps)
    res["bytes"] = bytes_per_rank(shards, args.steps, tmp)
    res["restore"] = restore_latency(shards)
    res["integrity"] = integrity_cost(shards, args.steps, args.rounds)
    if args.s3:
        url = upload_to_moto(shards)
        res["s3_throughput"] = throughput(url, args.steps)
        res["s3_restore"] = restore_latency(url)
    if args.json:
        print(json.dumps(res, indent=1))
        return
    p = res["padding"]
    print(
        f"## padding ({p['samples']} samples, mean {p['mean_tokens']:.0f} tokens, "
        f"max_tokens {MAX_TOKENS})"
    )
    print("| layout | padding |\n|---|---|")
    print(f"| packed (buffered FFD, {p['packs']} packs) | {p['padding_packed']:.2%} |")
    print(f"| pad every sample to max_tokens | {p['padding_pad_to_max_tokens']:.2%} |")
    print(f"| batches of 8 padded to their longest | {p['padding_pad_to_batch_max_b8']:.2%} |")
    print(f"\nplanning {p['samples']} samples took {p['plan_s']:.2f} s\n")
    print("## loader alone (decode on, 2 cores)\n| mode | workers | samples/s | tokens/s | MB/s |")
    print("|---|---|---|---|---|")
    for r in res["throughput"]:
        print(
            f"| {r['mode']} | {r['workers']} | {r['samples_s']:.1f} | {r['tokens_s']:.0f} | "
            f"{r['MB_s']:.2f} |"
        )
    b = res["bytes"]
    print(f"\n## bytes read per rank ({b['steps']} steps of 8 samples, group of k={b['k']})")
    print(
        f"read-then-gather: {b['bytes_per_rank_gather']} bytes per rank; "
        f"without: {b['bytes_per_rank_no_gather']} bytes per rank"
    )
    print("\n## time to first batch after restore (after 20 steps)")
    for where in ("restore", "s3_restore"):
        for mode, r in res.get(where, {}).items():
            print(
                f"{where} {mode}: {r['first_batch_s'] * 1000:.0f} ms, "
                f"state {r['state_bytes']} bytes JSON"
            )
    print_integrity(res["integrity"])
    for r in res.get("s3_throughput", []):
        print(f"S3 | {r['mode']} | {r['workers']} | {r['samples_s']:.1f} | {r['tokens_s']:.0f} |")


if __name__ == "__main__":
    main()
