"""The clip-search cache carries checksums: a cached index whose bytes changed (same size) is
rebuilt with one warning line instead of answering with impossible scores (issue #27, case 21)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pytest

from tests.search.test_search import write_clips_dir
from vfm_core.search import ClipSearch, ClipSearchConfig, IndexConfig, load_index
from vfm_core.search.index import META

EXACT = ClipSearchConfig(index=IndexConfig(backend="exact"))


def _flip(path: Path, n: int = 64) -> None:
    """Invert ``n`` bytes in the middle of ``path``: same size, different content."""
    data = bytearray(path.read_bytes())
    mid = len(data) // 2
    data[mid : mid + n] = bytes(b ^ 0xFF for b in data[mid : mid + n])
    path.write_bytes(bytes(data))


def _like_c4(root: Path, config: ClipSearchConfig) -> tuple[bool, list]:
    search = ClipSearch(str(root), config)
    hits = search.like("c4")
    return search.index("embedding").built, hits


@pytest.mark.parametrize(
    ("config", "data_file"),
    [(ClipSearchConfig(), "index.faiss"), (EXACT, "vectors.npy")],
    ids=["faiss", "exact"],
)
def test_a_flipped_cached_index_is_rebuilt_with_one_warning(tmp_path, caplog, config, data_file):
    root = write_clips_dir(tmp_path / "clips")
    built, want = _like_c4(root, config)
    assert built and want[0].clip_id == "c4"
    url = Path(ClipSearch(str(root), config).index("embedding").url)
    assert not ClipSearch(str(root), config).index("embedding").built  # cached, checksum ok
    _flip(url / data_file)
    with caplog.at_level(logging.WARNING, logger="vfm_core.search.cache"):
        built, hits = _like_c4(root, config)
    lines = [r.getMessage() for r in caplog.records if r.name == "vfm_core.search.cache"]
    assert built and len(lines) == 1
    assert f"{data_file} does not match its sha256" in lines[0] and str(url) in lines[0]
    assert [(h.clip_id, h.score) for h in hits] == [(h.clip_id, h.score) for h in want]
    assert all(-1.0 - 1e-5 <= h.score <= 1.0 + 1e-5 for h in hits)
    assert not ClipSearch(str(root), config).index("embedding").built  # the rebuild was cached


def test_edited_rows_are_rebuilt_and_old_folders_still_load(tmp_path, caplog):
    root = write_clips_dir(tmp_path / "clips")
    first = ClipSearch(str(root), EXACT).index("embedding")
    rows_path = Path(first.url, "rows.json")
    doc = json.loads(rows_path.read_text())
    doc["rows"] = doc["rows"][::-1]  # valid JSON, the wrong clip for every position
    rows_path.write_text(json.dumps(doc))
    with caplog.at_level(logging.WARNING, logger="vfm_core.search.cache"):
        again = ClipSearch(str(root), EXACT).index("embedding")
    assert again.built and "rows.json does not match its checksum" in caplog.text
    np.testing.assert_array_equal(again.rows, first.rows)
    # a folder saved before the checksums existed (no sha256 in meta.json) still loads
    meta_path = Path(first.url, META)
    meta = json.loads(meta_path.read_text())
    meta.pop("sha256")
    meta_path.write_text(json.dumps(meta))
    assert len(load_index(first.url)) == len(first.index)
