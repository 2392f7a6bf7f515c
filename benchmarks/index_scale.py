"""The dataset index at internet scale, by simulation: the columnar index (``samples.parquet``,
:mod:`vfm_core.data.columnar`) at 10^6, 10^7 and 10^8 rows against the JSON index (the peer, every
row in ``index.json``) at 10^6.

    .venv/bin/python benchmarks/index_scale.py [--sizes 1e6,1e7,1e8] [--quick] [--dir DIR]

No sample data: each synthetic index is written straight to parquet (numpy columns in chunks of
10^6 rows; 1,000 samples per shard of ~70 MB, five durations x four resolutions), its shards never
exist (the loader is built with ``verify="none"`` and never reads a byte range). Each measurement
runs in a fresh process (``--measure``) so its memory is its own; a simulated rank is rank 0 of 1
or rank 37 of 64 (every rank does the same work, so one rank is measured):

* open: ``read_index`` + ``build_loader`` (index.json, the parquet footer, stats checks);
* restore: ``load_state_dict`` of a state two and a half epochs in, then plan the first step
  (position -> sample for the whole global step, this rank's rows read);
* plan / step: median over 20 steps of planning the global step and looking up this rank's rows
  (key, shard, byte range) — unpacked (4 samples per rank) and packed (1 pack per rank, ~4
  samples each, so every rank reads the geometry of every sample of the global step);
* memory: the process's peak RSS growth from after the imports (``VmHWM`` - ``VmRSS``).

Targets (issue #16): at 10^8 rows open + restore < 2 s and < 300 MB per rank; plan time per step
independent of N.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from vfm_core.data.columnar_writer import ROW_GROUP_SIZE

PER_SHARD = 1000
SAMPLE_BYTES = 70_000
DURATIONS = np.array([1, 17, 33, 65, 121])
RESOLUTIONS = np.array([(256, 256), (192, 320), (320, 192), (720, 1280)])
PACKED = {"max_tokens": 4096, "buffer_size": 64, "batch_size": 1}
UNPACKED = {"batch_size": 4}


def _rss_mb(field: str) -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _shard_rows(n: int) -> list[dict]:
    n_shards = -(-n // PER_SHARD)
    rng = np.random.default_rng(1)
    shas = rng.integers(0, 256, (n_shards, 32), dtype=np.uint8)
    return [
        {
            "name": f"shard-{s:07d}.tar",
            "bytes": PER_SHARD * SAMPLE_BYTES,
            "n_samples": min(PER_SHARD, n - s * PER_SHARD),
            "sha256": shas[s].tobytes().hex(),
        }
        for s in range(n_shards)
    ]


def _chunk(start: int, stop: int):
    """Columns of samples [start, stop) as an arrow table (parquet schema)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    from vfm_core.data.columnar_writer import arrow_schema

    i = np.arange(start, stop, dtype=np.int64)
    rng = np.random.default_rng(start)
    res = RESOLUTIONS[rng.integers(0, len(RESOLUTIONS), len(i))]
    zeros = np.zeros(len(i), np.int32)
    cols = {
        "key": pc.binary_join_element_wise("s", pc.cast(pa.array(i), pa.string()), ""),
        "shard": i // PER_SHARD,
        "offset": (i % PER_SHARD) * SAMPLE_BYTES,
        "length": np.full(len(i), SAMPLE_BYTES - 512, np.int64),
        "frames": DURATIONS[rng.integers(0, len(DURATIONS), len(i))].astype(np.int32),
        "height": res[:, 0].astype(np.int32),
        "width": res[:, 1].astype(np.int32),
        **{c: zeros for c in ("latent_c", "latent_t", "latent_h", "latent_w")},
        "checksum": pa.nulls(len(i), pa.string()),  # synthetic rows: no per-sample checksum
    }
    return pa.Table.from_pydict(cols, schema=arrow_schema(False))


def write_parquet(root: Path, n: int, row_group_size: int) -> float:
    from vfm_core import storage
    from vfm_core.data.columnar_writer import write_samples
    from vfm_core.data.index import INDEX_NAME, columnar_doc

    t0 = time.perf_counter()
    step = 1_000_000
    chunks = (_chunk(a, min(n, a + step)) for a in range(0, n, step))
    stats = write_samples(
        str(root / "samples.parquet"), chunks, foreign=False, row_group_size=row_group_size
    )
    import pandas as pd

    doc = columnar_doc(
        pd.DataFrame(_shard_rows(n)),
        None,
        embedding_dim=16,
        meta={"writer": "benchmarks/index_scale.py"},
        stats=stats,
    )
    storage.write_bytes(str(root / INDEX_NAME), json.dumps(doc).encode())
    return time.perf_counter() - t0


def write_json(root: Path, n: int, row_group_size: int = 0) -> float:
    """The peer: every row in index.json (schema 1)."""
    t0 = time.perf_counter()
    rows = []
    for a in range(0, n, 1_000_000):
        d = _chunk(a, min(n, a + 1_000_000)).to_pydict()
        for j in range(len(d["key"])):
            rows.append(
                {
                    "key": d["key"][j],
                    "shard": d["shard"][j],
                    "offset": d["offset"][j],
                    "length": d["length"][j],
                    "frames": d["frames"][j],
                    "height": d["height"][j],
                    "width": d["width"][j],
                    "latent_shape": None,
                }
            )
    doc = {
        "schema_version": 1,
        "embedding_dim": 16,
        "n_samples": n,
        "shards": _shard_rows(n),
        "samples": rows,
        "meta": {},
    }
    (root / "index.json").write_text(json.dumps(doc))
    return time.perf_counter() - t0


# ---------------------------------------------------------------------------- one measurement
def measure(root: str, ranks: int, mode: str) -> dict:
    """In this (fresh) process: open, restore, plan, memory for one simulated rank."""
    from vfm_core.data.index import read_index
    from vfm_core.data.loader import build_loader

    base = _rss_mb("VmRSS")  # after the imports (pandas, pyarrow, torch: the same for both)
    kw = {**(PACKED if mode == "packed" else UNPACKED), "seed": 3, "decode": "none"}
    rank = 37 % ranks
    t0 = time.perf_counter()
    index = read_index(root)
    loader = build_loader(shards=index, dp_rank=rank, dp_size=ranks, verify="none", **kw)
    t_open = time.perf_counter() - t0
    n = len(index)

    state = loader.state_dict()
    state["planner"] = {**state["planner"], "position": 2 * n + n // 2, "steps": 10**6}
    json.dumps(state)  # the state is a small JSON dict at any N
    t0 = time.perf_counter()
    loader.load_state_dict(state)
    _plan_rows(loader)
    t_restore = time.perf_counter() - t0

    times = []
    for _ in range(20):
        t0 = time.perf_counter()
        _plan_rows(loader)
        times.append(time.perf_counter() - t0)
    return {
        "n": n,
        "open_s": t_open,
        "restore_s": t_restore,
        "plan_ms": statistics.median(times) * 1e3,
        "mem_mb": _rss_mb("VmHWM") - base,
        "state_bytes": len(json.dumps(state)),
    }


def _plan_rows(loader) -> None:
    """What a rank does for a step before reading bytes: plan, then its samples' rows."""
    _, (groups, _, _) = loader._plan()
    for g in groups:
        for p in g:
            row = loader.index.row(loader.order.sample(p))
            loader.index.shard_url(int(row["shard"]))


def run_child(root: Path, ranks: int, mode: str) -> dict:
    args = [sys.executable, __file__, "--measure", str(root), "--ranks", str(ranks), "--mode", mode]
    out = subprocess.run(args, capture_output=True, text=True, timeout=3600)
    if out.returncode != 0:
        raise SystemExit(out.stderr[-3000:])
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1e6,1e7,1e8")
    ap.add_argument("--quick", action="store_true", help="1e6 only")
    ap.add_argument("--dir", help="where the synthetic indexes go (default: a temp dir, removed)")
    ap.add_argument("--no-peer", action="store_true", help="skip the JSON index at 1e6")
    ap.add_argument("--row-group-size", type=int, default=ROW_GROUP_SIZE)
    ap.add_argument("--measure", help=argparse.SUPPRESS)
    ap.add_argument("--ranks", type=int, default=1, help=argparse.SUPPRESS)
    ap.add_argument("--mode", default="unpacked", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.measure:
        print(json.dumps(measure(args.measure, args.ranks, args.mode)))
        return 0
    sizes = [1_000_000] if args.quick else [int(float(v)) for v in args.sizes.split(",")]
    work = Path(args.dir or tempfile.mkdtemp(prefix="vfm-index-scale-"))
    cases = [("parquet", n) for n in sizes]
    if not args.no_peer:
        cases.insert(0, ("json (peer)", 1_000_000))
    print(
        "| N | index | write s | ranks | open s | restore s | open+restore s | "
        "plan ms/step unpacked | plan ms/step packed | peak RSS MB / rank |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    verdict = []
    try:
        for kind, n in cases:
            root = work / f"{kind.split()[0]}-{n:.0e}"
            root.mkdir(parents=True, exist_ok=True)
            write = write_json if kind.startswith("json") else write_parquet
            write_s = write(root, n, args.row_group_size)
            for ranks in (1, 64):
                u = run_child(root, ranks, "unpacked")
                p = run_child(root, ranks, "packed")
                mem = max(u["mem_mb"], p["mem_mb"])
                both = max(u["open_s"] + u["restore_s"], p["open_s"] + p["restore_s"])
                print(
                    f"| {n:.0e} | {kind} | {write_s:.1f} | {ranks} | {p['open_s']:.2f} | "
                    f"{p['restore_s']:.3f} | {both:.2f} | {u['plan_ms']:.2f} | "
                    f"{p['plan_ms']:.1f} | {mem:.0f} |",
                    flush=True,
                )
                if kind == "parquet" and n >= 10**8:
                    verdict.append((ranks, both, mem))
            shutil.rmtree(root)
    finally:
        if not args.dir:
            shutil.rmtree(work, ignore_errors=True)
    for ranks, both, mem in verdict:
        ok = both < 2 and mem < 300
        print(
            f"target at 1e8, {ranks} rank(s): open+restore {both:.2f} s (< 2), "
            f"{mem:.0f} MB (< 300): {'PASS' if ok else 'FAIL'}"
        )
    if not verdict:
        print("targets are stated at 1e8 rows: run with --sizes ...,1e8 to check them")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
