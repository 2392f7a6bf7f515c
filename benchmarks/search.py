"""Clip-search vector index: exact numpy (the peer) vs faiss-cpu IVF-Flat and HNSW.

    .venv/bin/python benchmarks/search.py [--sizes 100000,1000000] [--queries 500] [--threads 1]

Data: N unit vectors of dim 384 drawn around ``--centres`` random unit centres with isotropic
Gaussian noise of norm ~``--noise`` (2.0: a vector's cosine to its centre is ~0.45, to its exact
top-10 neighbours ~0.3-0.5 — clustered like caption embeddings, not separable by eye); queries are
fresh draws from the same mixture. Per index: build time (normalise + train + add), query time per
query (one batched ``search`` of all queries / Q), recall@10 against the exact top 10 (misses are
real, not float ties: float32 and float64 exact top-10 agree on this data). HNSW runs
only up to ``--hnsw-max`` vectors (its build is the slow part: see the table). Prints a markdown
table; ``--threads`` sets numpy BLAS and faiss OpenMP threads.
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import time


def _threads(n: int) -> None:
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[var] = str(n)  # before numpy is imported


def mixture(n: int, centres, noise: float, rng, *, chunk: int = 100_000):
    """(n, D) float32 unit vectors: centre + noise * N(0, I / D), normalised (in chunks)."""
    import numpy as np

    c, d = centres.shape
    out = np.empty((n, d), np.float32)
    for a in range(0, n, chunk):
        b = min(n, a + chunk)
        x = centres[rng.integers(0, c, b - a)]  # (b - a, D)
        x += (noise / np.sqrt(d)) * rng.standard_normal((b - a, d), dtype=np.float32)
        x /= np.linalg.norm(x, axis=1, keepdims=True)
        out[a:b] = x
    return out


def recall(ids, truth) -> float:
    """Mean |found top-k ∩ exact top-k| / k."""
    return sum(len(set(a) & set(b)) for a, b in zip(ids.tolist(), truth.tolist())) / truth.size


def _build(make, *args) -> tuple:
    t0 = time.perf_counter()
    index = make(*args)
    return index, time.perf_counter() - t0


def _query(index, q, k: int):
    """(ids (Q, k), ms per query) of one batched search."""
    t0 = time.perf_counter()
    _, ids = index.search(q, k)  # (Q, k)
    return ids, 1e3 * (time.perf_counter() - t0) / len(q)


def run(args) -> list[dict]:
    import numpy as np

    from vfm_core.search.index import ExactIndex, FaissIndex, IndexConfig, auto_nprobe

    rows: list[dict] = []

    def row(n, label, params, build_s, ids, ms, truth) -> None:
        rows.append(
            {
                "n": n,
                "index": label,
                "params": params,
                "build_s": build_s,
                "query_ms": ms,
                "recall": recall(ids, truth),
            }
        )
        print(f"  {rows[-1]}", file=sys.stderr, flush=True)

    rng = np.random.default_rng(args.seed)
    centres = rng.standard_normal((args.centres, args.dim), dtype=np.float32)
    centres /= np.linalg.norm(centres, axis=1, keepdims=True)  # (C, D)
    for n in args.sizes:
        x = mixture(n, centres, args.noise, rng)  # (N, D)
        q = mixture(args.queries, centres, args.noise, rng)  # (Q, D)

        exact, build_s = _build(ExactIndex, x, IndexConfig(backend="exact"))
        truth, ms = _query(exact, q, args.k)  # (Q, k): the reference
        row(n, "exact (numpy)", "", build_s, truth, ms, truth)
        del exact

        cfg = IndexConfig(faiss_kind="ivf", nlist=args.nlist)
        ivf, build_s = _build(FaissIndex.build, x, cfg)
        default = auto_nprobe(ivf.config.nlist)
        for p in sorted({default, *args.nprobe}):
            ivf.config.nprobe = ivf.index.nprobe = p
            ids, ms = _query(ivf, q, args.k)
            label = f"nlist {ivf.config.nlist}, nprobe {p}" + (" (default)" if p == default else "")
            row(n, "faiss IVF-Flat", label, build_s, ids, ms, truth)
        del ivf

        if n <= args.hnsw_max:
            cfg = IndexConfig(faiss_kind="hnsw")
            hnsw, build_s = _build(FaissIndex.build, x, cfg)
            for ef in args.ef_search:
                hnsw.config.ef_search = ef
                ids, ms = _query(hnsw, q, args.k)
                row(
                    n,
                    "faiss HNSW",
                    f"M {cfg.hnsw_m}, efC {cfg.ef_construction}, efSearch {ef}",
                    build_s,
                    ids,
                    ms,
                    truth,
                )
            del hnsw
        del x
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="100000,1000000", help="comma-separated N")
    ap.add_argument("--queries", type=int, default=500)
    ap.add_argument("--dim", type=int, default=384)
    ap.add_argument("--centres", type=int, default=1000)
    ap.add_argument("--noise", type=float, default=2.0)
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--nlist", type=int, default=0, help="IVF lists (0: the index's auto rule)")
    ap.add_argument("--nprobe", default="8,32", help="IVF nprobe values (+ the default)")
    ap.add_argument("--ef-search", default="64,128", help="HNSW efSearch values to measure")
    ap.add_argument("--hnsw-max", type=int, default=100_000, help="skip HNSW above this N")
    ap.add_argument("--threads", type=int, default=1, help="BLAS / OpenMP threads")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    args.sizes = [int(float(s)) for s in args.sizes.split(",")]
    args.nprobe = [int(s) for s in args.nprobe.split(",")]
    args.ef_search = [int(s) for s in args.ef_search.split(",")]
    _threads(args.threads)
    import faiss

    faiss.omp_set_num_threads(args.threads)
    t0 = time.perf_counter()
    rows = run(args)
    print(
        f"dim {args.dim}, {args.centres} Gaussian centres, noise {args.noise}, "
        f"{args.queries} queries, top-{args.k}, {args.threads} thread(s), faiss "
        f"{faiss.__version__}\n"
    )
    print("| N | index | params | build s | query ms/query | recall@10 |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['n']:,} | {r['index']} | {r['params']} | {r['build_s']:.1f} | "
            f"{r['query_ms']:.3f} | {r['recall']:.3f} |"
        )
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    print(f"\npeak RSS {peak:.1f} GB, total {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
