"""Vector index: cosine top-k over embeddings, two backends behind one interface.

    ExactIndex   numpy brute force, the peer: scores = Q @ X^T in query blocks, argpartition top-k
    FaissIndex   faiss-cpu approximate: IVF-Flat (the default, chosen by benchmarks/search.py) or
                 HNSW; inner product on unit vectors

Vectors are L2-normalised on build and on query, so inner product = cosine similarity. ``search``
returns ``(scores (Q, k) float32 best first, ids (Q, k) int64 row numbers)`` with
``k = min(top_k, len(index))``; an approximate index that finds fewer than k rows for a query pads
with id -1 and score -inf.

On disk an index is a folder (local or s3://): ``meta.json`` + ``vectors.npy`` (exact, loaded with
``allow_pickle=False``) or ``index.faiss`` (``faiss.serialize_index`` bytes). No pickle.
``meta.json`` (written last) records the sha256 of the data file; :func:`load_index` refuses a
file that does not match it (flipped bytes in ``index.faiss`` still deserialise and answer with
impossible scores and wrong rows). A folder saved before the checksum existed loads unchecked.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import math
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import numpy as np

from vfm_core import storage
from vfm_core.annotate.vectors import l2_normalize
from vfm_core.search.errors import SearchError

FORMAT = "vfm.search.index"
VERSION = 1
META = "meta.json"


@dataclass(kw_only=True, slots=True)
class IndexConfig:
    """How to build a vector index (stored in its meta.json; part of the clip-search cache key)."""

    backend: Literal["exact", "faiss"] = "faiss"
    """``exact``: numpy brute force; ``faiss``: approximate (``faiss_kind``)."""
    faiss_kind: Literal["ivf", "hnsw"] = "ivf"
    """IVF-Flat builds ~10x faster than HNSW here at equal recall (benchmarks/search.py)."""
    nlist: int = 0
    """IVF lists; 0: 4 sqrt(N), capped so that every list has >= 39 training vectors."""
    nprobe: int = 0
    """IVF lists scanned per query; 0: nlist / 32, at least 16 (at most nlist). Clustered data
    reaches recall@10 >= 0.99 from nprobe 8 (benchmarks/search.py); the margin is for captions
    that cluster less."""
    train_per_list: int = 64
    """IVF k-means trains on at most this many sampled vectors per list (faiss default 256)."""
    train_iters: int = 10
    """IVF k-means iterations (faiss default 25; 10 loses no recall in benchmarks/search.py)."""
    hnsw_m: int = 32
    """HNSW neighbours per node."""
    ef_construction: int = 80
    """HNSW candidate list while building."""
    ef_search: int = 128
    """HNSW candidate list while searching (>= top_k is enforced)."""
    block_bytes: int = 1 << 28
    """Exact search: size of one (queries, N) float32 score block."""


def unit(x: np.ndarray) -> np.ndarray:
    """Rows scaled to unit L2 norm (zero rows stay zero): (N, D) -> (N, D) float32, C order."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    if x.ndim != 2:
        raise SearchError(f"vectors must be a 2-D array (N, D), got shape {x.shape}")
    return l2_normalize(x)


class VectorIndex(Protocol):
    """What both backends offer."""

    config: IndexConfig
    dim: int

    def __len__(self) -> int: ...

    def search(self, queries: np.ndarray, top_k: int) -> tuple[np.ndarray, np.ndarray]: ...

    def save(self, url: str) -> str: ...


def _check_queries(queries: np.ndarray, dim: int, top_k: int) -> np.ndarray:
    q = np.asarray(queries, dtype=np.float32)
    q = q[None] if q.ndim == 1 else q  # (Q, D)
    if q.ndim != 2 or q.shape[1] != dim:
        raise SearchError(f"query vectors of shape {q.shape} do not match the index dim {dim}")
    if top_k < 1:
        raise SearchError(f"top_k must be >= 1, got {top_k}")
    return unit(q)


def _write_data(url: str, name: str, data: bytes) -> dict[str, Any]:
    """Write the index's data file; returns its meta entry (file name and sha256)."""
    storage.write_bytes(storage.join(url, name), data)
    return {"sha256": {name: hashlib.sha256(data).hexdigest()}}


def _read_data(url: str, name: str, meta: dict[str, Any]) -> bytes:
    """The data file ``name``, checked against the sha256 in ``meta`` when it records one."""
    data = storage.read_bytes(storage.join(url, name))
    want = (meta.get("sha256") or {}).get(name)
    if want is not None and hashlib.sha256(data).hexdigest() != want:
        raise ValueError(f"{name} does not match its sha256 in {META} (corrupt or replaced)")
    return data


def _write_meta(url: str, index: VectorIndex, extra: dict[str, Any]) -> None:
    meta = {
        "format": FORMAT,
        "version": VERSION,
        "dim": index.dim,
        "n": len(index),
        "config": dataclasses.asdict(index.config),
    } | extra
    storage.write_bytes(storage.join(url, META), json.dumps(meta, indent=1).encode())


class ExactIndex:
    """Brute-force cosine search in numpy; the reference the approximate index is measured on."""

    def __init__(self, vectors: np.ndarray, config: IndexConfig | None = None) -> None:
        self.config = config or IndexConfig(backend="exact")
        self.vectors = unit(vectors)  # (N, D)
        self.dim = int(self.vectors.shape[1])

    def __len__(self) -> int:
        return int(self.vectors.shape[0])

    def search(self, queries: np.ndarray, top_k: int) -> tuple[np.ndarray, np.ndarray]:
        q = _check_queries(queries, self.dim, top_k)  # (Q, D)
        n, k = len(self), min(top_k, len(self))
        scores = np.empty((len(q), k), np.float32)
        ids = np.empty((len(q), k), np.int64)
        if k == 0:
            return scores, ids
        step = max(1, self.config.block_bytes // (4 * n))  # queries per score block
        for a in range(0, len(q), step):
            s = q[a : a + step] @ self.vectors.T  # (b, N)
            if k < n:
                top = np.argpartition(-s, k - 1, axis=1)[:, :k]  # (b, k), unordered
            else:
                top = np.broadcast_to(np.arange(n), s.shape)  # (b, N)
            top_s = np.take_along_axis(s, top, axis=1)  # (b, k)
            order = np.argsort(-top_s, axis=1, kind="stable")  # (b, k)
            ids[a : a + step] = np.take_along_axis(top, order, axis=1)
            scores[a : a + step] = np.take_along_axis(top_s, order, axis=1)
        return scores, ids

    def save(self, url: str) -> str:
        buf = io.BytesIO()
        np.save(buf, self.vectors, allow_pickle=False)
        digest = _write_data(url, "vectors.npy", buf.getvalue())
        _write_meta(url, self, {"backend": "exact", **digest})  # last: the folder is complete
        return url


def _faiss():
    try:
        import faiss
    except ImportError as e:
        raise SearchError(
            "the faiss backend needs faiss-cpu (pip install faiss-cpu); "
            "or use the exact backend (--exact)"
        ) from e
    return faiss


def auto_nlist(n: int, nlist: int = 0) -> int:
    """IVF list count for ``n`` vectors: ``nlist`` or 4 sqrt(n), at most n / 39 (faiss wants
    >= 39 training vectors per centroid), at least 1."""
    want = nlist or int(round(4 * math.sqrt(n)))
    return max(1, min(want, n // 39))


def auto_nprobe(nlist: int) -> int:
    return max(16, nlist // 32)


class FaissIndex:
    """faiss-cpu IVF-Flat or HNSW over unit vectors with the inner-product metric (= cosine)."""

    def __init__(self, index: Any, config: IndexConfig) -> None:
        self.index, self.config = index, config
        self.dim = int(index.d)
        self._set_search_params()

    @classmethod
    def build(cls, vectors: np.ndarray, config: IndexConfig | None = None) -> FaissIndex:
        faiss = _faiss()
        cfg = dataclasses.replace(config or IndexConfig(), backend="faiss")
        x = unit(vectors)  # (N, D)
        n, d = x.shape
        if cfg.faiss_kind == "hnsw":
            index = faiss.IndexHNSWFlat(d, cfg.hnsw_m, faiss.METRIC_INNER_PRODUCT)
            index.hnsw.efConstruction = cfg.ef_construction
        elif cfg.faiss_kind == "ivf":
            cfg.nlist = auto_nlist(n, cfg.nlist)
            cfg.nprobe = min(cfg.nlist, cfg.nprobe or auto_nprobe(cfg.nlist))
            quantizer = faiss.IndexFlatIP(d)
            index = faiss.IndexIVFFlat(quantizer, d, cfg.nlist, faiss.METRIC_INNER_PRODUCT)
            index.cp.seed = 1234  # spherical k-means (set by faiss for IP), reproducible
            index.cp.max_points_per_centroid = cfg.train_per_list
            index.cp.niter = cfg.train_iters
            if cfg.nlist == 1:  # fewer than 39 vectors: one list, nothing to warn about
                index.cp.min_points_per_centroid = 1
            if n:
                index.train(x)
        else:
            raise SearchError(f"unknown faiss index kind {cfg.faiss_kind!r} (ivf or hnsw)")
        if n:
            index.add(x)
        return cls(index, cfg)

    def _set_search_params(self) -> None:
        if self.config.faiss_kind == "ivf":
            self.index.nprobe = max(1, self.config.nprobe)
        else:
            self.index.hnsw.efSearch = self.config.ef_search

    def __len__(self) -> int:
        return int(self.index.ntotal)

    def search(self, queries: np.ndarray, top_k: int) -> tuple[np.ndarray, np.ndarray]:
        q = _check_queries(queries, self.dim, top_k)  # (Q, D)
        k = min(top_k, len(self))
        if k == 0:
            return np.empty((len(q), 0), np.float32), np.empty((len(q), 0), np.int64)
        if self.config.faiss_kind == "hnsw":
            self.index.hnsw.efSearch = max(self.config.ef_search, k)
        scores, ids = self.index.search(q, k)  # (Q, k), (Q, k); -1 where nothing was found
        scores = np.where(ids < 0, -np.inf, scores).astype(np.float32)
        return scores, ids.astype(np.int64)

    def save(self, url: str) -> str:
        faiss = _faiss()
        data = faiss.serialize_index(self.index)  # (bytes,) uint8
        digest = _write_data(url, "index.faiss", np.asarray(data).tobytes())
        _write_meta(url, self, {"backend": "faiss", **digest})  # last: the folder is complete
        return url


def build_index(vectors: np.ndarray, config: IndexConfig | None = None) -> VectorIndex:
    """An index over ``vectors`` (N, D) with ``config.backend``."""
    cfg = config or IndexConfig()
    if cfg.backend == "exact":
        return ExactIndex(vectors, cfg)
    if cfg.backend == "faiss":
        return FaissIndex.build(vectors, cfg)
    raise SearchError(f"unknown index backend {cfg.backend!r} (exact or faiss)")


def load_index(url: str) -> VectorIndex:
    """An index saved by ``save(url)``; :class:`SearchError` naming ``url`` when it is missing,
    incomplete, of another format or its data file fails its sha256."""
    try:
        meta = json.loads(storage.read_bytes(storage.join(url, META)))
        if meta.get("format") != FORMAT or meta.get("version") != VERSION:
            raise ValueError(f"format {meta.get('format')!r} v{meta.get('version')!r}")
        cfg = IndexConfig(**meta["config"])
        if meta["backend"] == "exact":
            buf = io.BytesIO(_read_data(url, "vectors.npy", meta))
            vectors = np.load(buf, allow_pickle=False)  # (N, D)
            index: VectorIndex = ExactIndex(vectors, cfg)
        else:
            faiss = _faiss()
            data = _read_data(url, "index.faiss", meta)
            index = FaissIndex(faiss.deserialize_index(np.frombuffer(data, np.uint8)), cfg)
        if len(index) != meta["n"] or index.dim != meta["dim"]:
            raise ValueError(
                f"holds {len(index)} x {index.dim}, meta says {meta['n']} x {meta['dim']}"
            )
    except (storage.StorageError, ValueError, KeyError, TypeError, RuntimeError) as e:
        raise SearchError(f"{url}: not a readable vector index ({e})") from None
    return index
