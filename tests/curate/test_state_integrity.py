"""A damaged curation state file (truncated, corrupt bytes) is reported in one warning line and
rebuilt from the manifests of the last run instead of stopping (issue #17): the rerun skips the
video and writes the same manifests; with other settings the video is curated again."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from tests.curate.conftest import CFG, assert_covered
from vfm_core.curate import curate
from vfm_core.curate.pipeline import read_clips


@pytest.mark.parametrize("damage", ["truncate", "flip"])
def test_damaged_state_is_reported_and_rebuilt_from_the_manifests(
    good_dir, tmp_path, caplog, damage
):
    src, dst = str(good_dir[0]), str(tmp_path / "out")
    first = curate(src, dst, config=CFG)
    before = read_clips(dst)
    state = sorted(p for p in (Path(dst) / "_state").iterdir() if not p.name.startswith("_"))[0]
    raw = state.read_bytes()
    state.write_bytes(raw[: len(raw) // 2] if damage == "truncate" else b"\xff\xfe" + raw[2:])
    with caplog.at_level(logging.WARNING, logger="vfm_core.curate.pipeline"):
        again = curate(src, dst, config=CFG)
    lines = [r.getMessage() for r in caplog.records if "damaged" in r.getMessage()]
    assert len(lines) == 1 and lines[0].startswith(f"curation state {state} of ")
    assert lines[0].endswith("rebuilt from the manifests")
    assert again["n_skipped"] == 2 and again["n_clips"] == first["n_clips"]
    assert read_clips(dst).equals(before)
    assert_covered(dst)
    assert state.read_bytes() != b"" and curate(src, dst, config=CFG)["n_skipped"] == 2
