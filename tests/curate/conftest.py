"""A source folder of tiny synthetic videos (with sidecar captions) plus every bad input."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from vfm_core.curate import CurateConfig
from vfm_core.video.synthetic import BAD_KINDS, GroundTruth, demo_spec, make_bad_input, make_video

# tiny test videos are 2 s long: keep 1 s shots
CFG = CurateConfig(min_len_s=1.0)


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
