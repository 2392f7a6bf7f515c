"""Synthetic videos with known cuts, written once per test session."""

from __future__ import annotations

from pathlib import Path

import pytest

from vfm_core.video.synthetic import BAD_KINDS, GroundTruth, demo_spec, make_bad_input, make_video


@pytest.fixture(scope="session")
def video_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("videos")


@pytest.fixture(scope="session")
def demo_videos(video_dir: Path) -> list[tuple[Path, GroundTruth]]:
    """Three 128x72 24 fps videos (~17 s each): 5 hard cuts, 2 dissolves, static, black."""
    out = []
    for seed in range(3):
        p = video_dir / f"demo{seed}.mp4"
        out.append((p, make_video(p, demo_spec(seed=seed))))
    return out


@pytest.fixture(scope="session")
def demo_video(demo_videos: list[tuple[Path, GroundTruth]]) -> tuple[Path, GroundTruth]:
    return demo_videos[0]


@pytest.fixture(scope="session")
def bad_inputs(video_dir: Path) -> dict[str, Path]:
    return {k: make_bad_input(k, video_dir / f"bad_{k}.mp4") for k in BAD_KINDS}
