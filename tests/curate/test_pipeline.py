"""End to end on a local folder: clips + validated manifests, bad inputs, resume, no duplicates."""

from __future__ import annotations

import io
import logging
import os
from pathlib import Path

import av
import numpy as np
import polars as pl
import pytest

from tests.curate.conftest import CFG, assert_covered
from vfm_core.contracts import Rejects, VideoManifest, read_manifest
from vfm_core.curate import CurateConfig, LocalExecutor, curate, discover
from vfm_core.curate.pipeline import read_clips
from vfm_core.storage import StorageError
from vfm_core.video.io import decode_frames, probe
from vfm_core.video.synthetic import BAD_KINDS, Segment, VideoSpec, make_video, tone_levels


def _inputs(src: Path) -> set[str]:
    return {str(p) for p in src.rglob("*.mp4")}


def test_discover_keeps_source_as_given(src_dir, monkeypatch, caplog):
    monkeypatch.chdir(src_dir.parent)
    with caplog.at_level("WARNING", logger="vfm_core.curate.inputs"):
        refs = discover(src_dir.name)
    assert len(refs) == 2 + len(BAD_KINDS)  # notes.md is not an input, and is named as such
    assert "1 file(s) without a video suffix are not curated (.md 1;" in caplog.text
    assert refs[0].source_uri == f"{src_dir.name}/bad/10bit.mp4"
    assert all(os.path.isabs(r.url) and Path(r.url).exists() for r in refs)
    one = discover(f"{src_dir.name}/demo0.mp4")
    assert [r.source_uri for r in one] == [f"{src_dir.name}/demo0.mp4"]


def test_curate_folder_end_to_end(src_dir, good_dir, tmp_path, monkeypatch, caplog):
    dst = tmp_path / "out"
    monkeypatch.setenv("VFM_PROGRESS_EVERY_S", "0")  # progress lines inside every video
    with caplog.at_level(logging.INFO, logger="vfm_core.progress"):
        out = curate(str(src_dir), str(dst), config=CFG)
    lines = [r.getMessage() for r in caplog.records if r.name == "vfm_core.progress"]
    for phase in ("split", "transcode"):  # seconds done / total, rate, time left
        assert any(
            x.startswith(f"{phase} demo0.mp4: ") and "s of video" in x and "x realtime" in x
            for x in lines
        ), lines[:5]
    clips = read_clips(str(dst))
    rejects = read_manifest(dst / "rejects.parquet", Rejects)
    videos = read_manifest(dst / "videos.parquet", VideoManifest)
    assert (
        out["n_inputs"] == 2 + len(BAD_KINDS)
        and out["n_clips"] == clips.height
        and out["n_skipped"] == 0
    )
    # accepted ∪ rejected = inputs, and every second of each readable input is in a row
    assert set(clips["source_uri"]) | set(rejects["source_uri"]) == _inputs(src_dir)
    assert_covered(dst)
    assert out["coverage_gaps"] == [] and out["rejected_s"] > 0
    # the clips on disk are exactly the manifest's, unique, H.264, keyframe first
    assert clips["clip_id"].n_unique() == clips.height
    assert set(clips["audio"]) == {"none"} and out["n_audio"] == 0  # silent sources
    assert sorted(os.listdir(dst / "clips")) == sorted(f"{c}.mp4" for c in clips["clip_id"])
    for row in clips.iter_rows(named=True):
        info = probe(row["uri"])
        assert info.codec == "h264" and info.n_frames == row["n_frames"]
        assert (info.width, info.height) == (row["width"], row["height"])
        with av.open(row["uri"]) as c:
            assert next(c.demux(c.streams.video[0])).is_keyframe
    # shot boundaries of demo0 follow the ground truth (±2 frames); the static shot is rejected
    _, truth = good_dir
    gt = truth["demo0.mp4"]
    d0 = clips.filter(pl.col("source_uri") == str(src_dir / "demo0.mp4")).sort("start_s")
    starts = d0["start_frame"].to_list()

    def at_transition(f: int) -> bool:
        near_cut = any(abs(f - a) <= 2 for a, _ in gt.segments)
        return near_cut or any(a - 2 <= f <= b + 2 for a, b in gt.fades)

    assert len(starts) >= 5 and all(at_transition(f) for f in starts), starts
    static = rejects.filter(pl.col("stage") == "filter")
    assert static.height == 2 and static["reason"].str.starts_with("static").all()
    assert static["start_s"].to_list() == pytest.approx([180 / 24] * 2, abs=0.1)
    # captions: .txt sidecar for demo0, the JSON segment (or its fallback) for demo1
    assert set(d0["caption"]) == {gt.caption}
    d1 = clips.filter(pl.col("source_uri") == str(src_dir / "demo1.mp4")).sort("start_s")
    assert d1["caption"][0] == "the first shot" and set(d1["caption"][1:]) == {"fallback"}
    assert clips["embedding"].list.len().unique().to_list() == [448]
    # every readable input (a truncated one's prefix too) is in the video manifest, ids are
    # content hashes
    assert videos.height == 2 + 6 and videos["video_id"].n_unique() == 8


@pytest.mark.parametrize(
    ("kind", "stage", "reason"),
    [
        ("zero_byte", "probe", "empty file (0 bytes)"),
        ("truncated", "probe", "MP4 without its index (no moov box)"),
        ("not_video", "probe", "not a readable media file"),
        ("audio_only", "probe", "no video stream (audio only)"),
        ("cover_art", "probe", "no video stream (audio and a cover picture only)"),
        (
            "one_frame",
            "split",
            "no shot of at least 1 s: all 1 shot(s) shorter (longest 0.04 s; video is 0.04 s, "
            "1 frames)",
        ),
    ],
)
def test_bad_input_is_rejected_with_reason(bad_dir, tmp_path, kind, stage, reason):
    src = str(bad_dir / f"{kind}.mp4")
    out = curate(src, str(tmp_path / "o"), config=CFG)
    rej = read_manifest(tmp_path / "o" / "rejects.parquet", Rejects)
    assert out["n_clips"] == 0 and rej.height == 1
    assert_covered(tmp_path / "o")
    assert rej.row(0, named=True)["source_uri"] == src
    assert rej["stage"][0] == stage and rej["reason"][0].startswith(reason), rej["reason"][0]


@pytest.mark.parametrize(
    ("kind", "size", "fps"),
    [
        ("vfr", (96, 64), 22.06),
        ("rotated", (64, 96), 24.0),
        ("yuv444", (96, 64), 24.0),
        ("10bit", (96, 64), 24.0),
    ],
)
def test_valid_unusual_input_is_processed(bad_dir, tmp_path, kind, size, fps):
    out = curate(str(bad_dir / f"{kind}.mp4"), str(tmp_path / "o"), config=CFG)
    clips = read_clips(str(tmp_path / "o"))
    assert out["n_clips"] == 1 and out["n_rejects"] == 0
    assert_covered(tmp_path / "o")
    row = clips.row(0, named=True)
    assert (row["width"], row["height"]) == size and row["fps"] == pytest.approx(fps, abs=0.01)
    info = probe(row["uri"])
    # clips are upright, constant-rate, 8-bit 4:2:0
    assert info.pix_fmt == "yuv420p" and not info.vfr and info.rotation == 0
    assert row["n_frames"] == 48


def test_width_above_the_source_is_named_once(bad_dir, tmp_path, caplog):
    """--width above a video's picture: its clips keep the source width (never upscaled), and
    one warning names the video and the width it kept."""
    cfg = CurateConfig(min_len_s=1.0, out_width=200)
    with caplog.at_level(logging.WARNING, logger="vfm_core.curate.pipeline"):
        curate(str(bad_dir / "yuv444.mp4"), str(tmp_path / "o"), config=cfg)
    assert read_clips(str(tmp_path / "o"))["width"].to_list() == [96]
    said = [r.getMessage() for r in caplog.records if "never upscaled" in r.getMessage()]
    assert len(said) == 1 and "--width 200" in said[0] and "yuv444.mp4 (96 px)" in said[0]


def test_huge_declared_size_rejected(bad_dir, tmp_path):
    cfg = CurateConfig(min_len_s=1.0, max_pixels=64 * 64)
    curate(str(bad_dir / "yuv444.mp4"), str(tmp_path / "o"), config=cfg)
    rej = read_manifest(tmp_path / "o" / "rejects.parquet", Rejects)
    assert rej["reason"][0] == "declared frame size 96x64 exceeds 4096 pixels"
    assert_covered(tmp_path / "o")


class _Crash(RuntimeError):
    pass


class CrashInSecond(LocalExecutor):
    """Dies at the second final item of the second video (a worker crash in the middle of a
    run: the first video done, the second half written)."""

    def run(self, stages, items):
        seen: list[str] = []
        for i, x in enumerate(super().run(stages, items)):
            seen.append(x.source_uri)
            if len(set(seen)) == 2 and seen.count(x.source_uri) == 2:
                raise _Crash(f"crash after {i} items")
            yield x


def test_resume_after_crash_skips_finished_and_never_duplicates(good_dir, tmp_path):
    src, dst = str(good_dir[0]), str(tmp_path / "out")
    with pytest.raises(_Crash):
        curate(src, dst, config=CFG, executor=CrashInSecond())  # demo0 done, demo1 half written
    assert len(os.listdir(Path(dst) / "_state")) == 1
    out = curate(src, dst, config=CFG)
    assert out["n_skipped"] == 1
    clips = read_clips(dst)
    assert clips["clip_id"].n_unique() == clips.height == out["n_clips"]
    assert sorted(os.listdir(Path(dst) / "clips")) == sorted(f"{c}.mp4" for c in clips["clip_id"])
    fresh = curate(src, str(tmp_path / "fresh"), config=CFG)
    assert fresh["n_clips"] == out["n_clips"]
    assert read_clips(str(tmp_path / "fresh"))["clip_id"].to_list() == clips["clip_id"].to_list()
    again = curate(src, dst, config=CFG)
    assert again["n_skipped"] == 2 and again["n_clips"] == out["n_clips"]
    assert_covered(dst)
    # other clip settings: everything is redone, with other clip ids
    other = curate(src, dst, config=CurateConfig(min_len_s=1.0, crf=30))
    assert other["n_skipped"] == 0
    redone = read_clips(dst)["clip_id"]
    assert set(redone).isdisjoint(set(clips["clip_id"]))
    # the replaced clips are gone: DST/clips holds exactly the manifest's
    assert sorted(os.listdir(Path(dst) / "clips")) == sorted(f"{c}.mp4" for c in redone)


def test_missing_or_empty_source(tmp_path):
    with pytest.raises(StorageError, match="no such directory"):
        curate(str(tmp_path / "nope"), str(tmp_path / "o"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(StorageError, match="no video files found"):
        curate(str(tmp_path / "empty"), str(tmp_path / "o"))
    with pytest.raises(ValueError, match="executor: unknown 'spark'"):
        curate(str(tmp_path / "empty"), str(tmp_path / "o"), executor="spark")
    with pytest.raises(ValueError, match="CurateConfig.splitter: unknown 'magic'"):
        curate(str(tmp_path / "empty"), str(tmp_path / "o"), config=CurateConfig(splitter="magic"))


def test_duplicate_content_is_rejected_once(good_dir, tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    os.link(good_dir[0] / "demo0.mp4", src / "a.mp4")
    os.link(good_dir[0] / "demo0.mp4", src / "b.mp4")
    out = curate(str(src), str(tmp_path / "o"), config=CFG)
    clips = read_clips(str(tmp_path / "o"))
    rej = read_manifest(tmp_path / "o" / "rejects.parquet", Rejects)
    assert set(clips["source_uri"]) == {str(src / "a.mp4")} and out["n_clips"] == clips.height
    dup = rej.filter(pl.col("source_uri") == str(src / "b.mp4"))
    assert dup["reason"].to_list() == [f"duplicate: same content as {src / 'a.mp4'}"]
    videos = read_manifest(tmp_path / "o" / "videos.parquet", VideoManifest)
    assert videos["source_uri"].to_list() == [str(src / "a.mp4")]
    assert dup["start_s"].to_list() == [0.0] and dup["end_s"][0] == videos["duration_s"][0]
    assert_covered(tmp_path / "o")


def test_sound_is_kept_per_clip_or_dropped(tmp_path):
    """--audio keep (the default): each clip has its span's sound, the tone of its own shot;
    drop: clips without sound. The clips manifest says which (none: a silent source)."""
    spec = VideoSpec(segments=(Segment(n_frames=36),) * 2, audio_rate=16000)  # cut at 1.5 s
    make_video(tmp_path / "src" / "toned.mp4", spec)
    kept = curate(str(tmp_path / "src"), str(tmp_path / "k"), config=CFG)
    clips = read_clips(str(tmp_path / "k")).sort("start_s")
    assert clips.height == 2 and clips["audio"].to_list() == ["kept"] * 2 and kept["n_audio"] == 2
    for shot, row in enumerate(clips.iter_rows(named=True)):
        with av.open(row["uri"]) as c:
            a = c.streams.audio[0]
            assert abs(a.duration * a.time_base - row["duration_s"]) <= 1024 / 16000
            x = np.concatenate([f.to_ndarray() for f in c.decode(a)], 1)[0]
        levels = tone_levels(x[: round(row["duration_s"] * 16000)], 16000, 2)  # (W, 2)
        assert (levels[:, shot] > 0.2).all() and (levels[:, 1 - shot] < 0.05).all()
        mp4 = io.BytesIO(Path(row["uri"]).read_bytes())  # as a shard holds it: the loader's read
        assert len(decode_frames(mp4, threads="SLICE")) == row["n_frames"]
    drop = CurateConfig(min_len_s=1.0, audio="drop")
    assert "audio" not in drop.clip_settings()  # clips as before the setting: ids unchanged
    curate(str(tmp_path / "src"), str(tmp_path / "d"), config=drop)
    dropped = read_clips(str(tmp_path / "d"))
    assert dropped["audio"].to_list() == ["dropped"] * 2
    for uri in dropped["uri"]:
        with av.open(uri) as c:
            assert not c.streams.audio
