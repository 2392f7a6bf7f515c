"""Clip search: text query or like-this clip -> nearest clips of a curated clips dir.

    errors.py    SearchError: a bad query / clip id / manifest, named (``vfm`` prints one line)
    index.py     vector index, one interface: ExactIndex (numpy, the peer) | FaissIndex
                 (IVF-Flat / HNSW); build / search(top_k) / save / load, no pickle
    manifest.py  clips.parquet: digest, caption / embedding columns, subsets
    cache.py     indexes cached in CLIPS_DIR/_search/, keyed by the manifest digest
    clips.py     ClipSearch (query, like), search_clips, contact sheet, subset manifest

Front ends: ``vfm search`` (vfm_core/cli.py) and the Prefect task ``tasks/search.py``.
"""

from vfm_core.search.clips import (
    ClipSearch,
    ClipSearchConfig,
    SearchHit,
    contact_sheet_of,
    search_clips,
    write_subset,
)
from vfm_core.search.errors import SearchError
from vfm_core.search.index import ExactIndex, FaissIndex, IndexConfig, build_index, load_index

__all__ = [
    "ClipSearch",
    "ClipSearchConfig",
    "ExactIndex",
    "FaissIndex",
    "IndexConfig",
    "SearchError",
    "SearchHit",
    "build_index",
    "contact_sheet_of",
    "load_index",
    "search_clips",
    "write_subset",
]
