"""An interrupted curation leaves no orphan clip (#26): a Ctrl-C while a video's clips are being
made, or a kill that leaves uncommitted clips behind, and the rerun makes the same clips as an
uninterrupted run."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from tests.curate.conftest import CFG, assert_covered
from vfm_core.curate import curate
from vfm_core.curate.clip_stages import PENDING, AnnotateStage
from vfm_core.curate.pipeline import read_clips


def _named_by_states(dst: Path) -> set[str]:
    """Clip files the finished videos' state files name."""
    names = set()
    for p in (dst / "_state").glob("*.json"):
        if not p.name.startswith("_"):
            names |= {f"{c['clip_id']}.mp4" for c in json.loads(p.read_text())["clips"]}
    return names


def _files(d: Path) -> set[str]:
    return set(os.listdir(d)) if d.exists() else set()


def test_interrupt_leaves_no_orphan_and_rerun_is_the_same(good_dir, tmp_path, monkeypatch):
    """Two demo videos; Ctrl-C at the annotation of the second video's third clip: the first
    video is finished (state + committed clips), the second left nothing. ~5 s."""
    src = tmp_path / "src"
    src.mkdir()
    for p in good_dir[0].iterdir():
        shutil.copy(p, src / p.name)
    ref = tmp_path / "ref"
    curate(str(src), str(ref), config=CFG, progress=False)
    want = sorted(os.listdir(ref / "clips"))
    assert want

    dst = tmp_path / "out"
    one = AnnotateStage.one
    seen: dict[str, int] = {}

    def interrupted(self, item):
        uri = item.span.video.source_uri
        seen[uri] = seen.get(uri, 0) + 1
        if len(seen) == 2 and seen[uri] == 3:  # clips of this video are already encoded
            assert _files(dst / PENDING), "the encoder's clips wait in DST/_pending"
            raise KeyboardInterrupt
        return one(self, item)

    monkeypatch.setattr(AnnotateStage, "one", interrupted)
    with pytest.raises(KeyboardInterrupt):
        curate(str(src), str(dst), config=CFG, progress=False)
    monkeypatch.setattr(AnnotateStage, "one", one)

    on_disk = _files(dst / "clips")
    assert on_disk == _named_by_states(dst)  # no clip that no state names
    assert len(list((dst / "_state").glob("*.json"))) == 1  # the first video only
    assert on_disk and on_disk < set(want)
    assert not (dst / PENDING).exists() and not (dst / "clips.parquet").exists()

    # a kill (no cleanup) leaves encoded clips and half-written files in DST/_pending
    (dst / PENDING).mkdir()
    (dst / PENDING / "0123456789abcdef.mp4").write_bytes(b"an uncommitted clip")
    (dst / PENDING / ".0123456789abcdef.77.part.mp4").write_bytes(b"half")

    out = curate(str(src), str(dst), config=CFG, progress=False)
    assert out["n_skipped"] == 1
    assert sorted(os.listdir(dst / "clips")) == want  # the same clips as the clean run
    assert sorted(f"{c}.mp4" for c in read_clips(str(dst))["clip_id"]) == want
    assert not (dst / PENDING).exists()
    assert_covered(dst)
