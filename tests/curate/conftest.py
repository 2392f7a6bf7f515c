"""A source folder of tiny synthetic videos (with sidecar captions) plus every bad input, and
`assert_covered`: every second of every probed input is in a clip or a reject row."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from vfm_core import storage
from vfm_core.contracts import AnnotatedClips, Rejects, VideoManifest, read_manifest
from vfm_core.curate import CurateConfig
from vfm_core.curate.coverage import coverage_gaps
from vfm_core.video.synthetic import BAD_KINDS, GroundTruth, demo_spec, make_bad_input, make_video

# tiny test videos are 2 s long: keep 1 s shots
CFG = CurateConfig(min_len_s=1.0)


def assert_covered(dst: str | Path, *, frames: float = 2.0) -> None:
    """The coverage invariant of a curation output: each probed input's duration is covered by
    its clip and reject rows, up to `frames` frames at a boundary."""
    dst = str(dst)
    clips = read_manifest(storage.join(dst, "clips.parquet"), AnnotatedClips)
    rejects = read_manifest(storage.join(dst, "rejects.parquet"), Rejects)
    videos = read_manifest(storage.join(dst, "videos.parquet"), VideoManifest)
    durations = dict(zip(videos["source_uri"], videos["duration_s"], strict=True))
    tol = {u: frames / f for u, f in zip(videos["source_uri"], videos["fps"], strict=True)}
    gaps = coverage_gaps(clips, rejects, durations, tol_s=tol)
    assert not gaps, "seconds in no clip and no reject: " + "; ".join(map(str, gaps))
    timed = rejects.filter(rejects["source_uri"].is_in(list(durations)))
    assert timed["start_s"].is_not_null().all() and timed["end_s"].is_not_null().all(), timed


@pytest.fixture(scope="session")
def good_dir(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, GroundTruth]]:
    """Two 128x72 demo videos (~17 s: cuts, dissolves, static, black); a .txt and a .json
    sidecar caption."""
    d = tmp_path_factory.mktemp("good")
    truth = {}
    for seed in range(2):
        truth[f"demo{seed}.mp4"] = make_video(d / f"demo{seed}.mp4", demo_spec(seed=seed))
    (d / "demo1.txt").unlink()
    (d / "demo1.json").write_text(
        json.dumps(
            {
                "caption": "fallback",
                "segments": [{"start_s": 0.0, "end_s": 2.5, "caption": "the first shot"}],
            }
        )
    )
    return d, truth


@pytest.fixture(scope="session")
def bad_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("bad")
    for k in BAD_KINDS:
        make_bad_input(k, d / f"{k}.mp4")
    return d


@pytest.fixture(scope="session")
def src_dir(tmp_path_factory, good_dir, bad_dir) -> Path:
    """good videos at the top, bad inputs under bad/ (a nested folder)."""
    d = tmp_path_factory.mktemp("src")
    shutil.copytree(good_dir[0], d, dirs_exist_ok=True)
    shutil.copytree(bad_dir, d / "bad")
    (d / "notes.md").write_text("not an input: wrong suffix\n")
    return d
