"""`vfm curate SRC DST` (the acceptance contract), as a subprocess."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest

from tests.curate.conftest import assert_covered
from vfm_core.contracts import AnnotatedClips, Rejects, read_manifest

VFM = [sys.executable, "-m", "vfm_core.cli"]


def _run(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2]))
    return subprocess.run([*VFM, *args], cwd=cwd, env=env, capture_output=True, text=True)


def test_vfm_curate_folder(good_dir, bad_dir, tmp_path):
    src = tmp_path / "raw"
    src.mkdir()
    for p in [*good_dir[0].iterdir(), bad_dir / "not_video.mp4"]:
        os.link(p, src / p.name)
    r = _run("curate", "raw", "out", "--min-len", "1", "--json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    summary = json.loads(r.stdout)
    clips = read_manifest(tmp_path / "out" / "clips.parquet", AnnotatedClips)
    rejects = read_manifest(tmp_path / "out" / "rejects.parquet", Rejects)
    assert summary["n_clips"] == clips.height > 10
    # source_uri is the input file as given under SRC
    assert set(clips["source_uri"]) == {"raw/demo0.mp4", "raw/demo1.mp4"}
    assert "raw/not_video.mp4" in set(rejects["source_uri"])
    assert {"clip_id", "video_id", "source_uri", "start_s", "end_s", "uri", "caption"} <= set(
        clips.columns
    )
    assert all((tmp_path / u).exists() for u in clips["uri"])
    assert_covered(tmp_path / "out")
    rejected = summary["rejected_s"]
    assert rejected > 0 and summary["coverage_gaps"] == []
    again = _run("curate", "raw", "out", "--min-len", "1", cwd=tmp_path)
    assert again.returncode == 0 and "(3 already done)" in again.stdout
    assert f"rejects ({rejected:.1f} s rejected)" in again.stdout, again.stdout
    assert pl.read_parquet(tmp_path / "out" / "clips.parquet").height == clips.height


def test_every_input_rejected_fails_with_the_count(tmp_path, capsys):
    """The manifests are written (the rejects say why), and the command fails with the count."""
    from vfm_core.cli import main

    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "x.mp4").write_bytes(b"not a video")
    assert main(["curate", str(tmp_path / "bad"), str(tmp_path / "out")]) == 1
    out, err = capsys.readouterr()
    assert "0 clips" in out
    assert "curation of 1 videos produced no clip: every input was rejected (1 rejects" in err
    assert (tmp_path / "out" / "rejects.parquet").is_file()


def test_vfm_curate_errors(tmp_path):
    r = _run("curate", "missing", "out", cwd=tmp_path)
    assert r.returncode == 2 and "vfm curate: error:" in r.stderr and "missing" in r.stderr
    r = _run("curate", "a", "b", "--executor", "spark", cwd=tmp_path)
    assert r.returncode == 2 and "invalid choice: 'spark'" in r.stderr
    r = _run("curate", "a", "b", "--fps", "-3", cwd=tmp_path)
    assert r.returncode == 2 and "--fps must be > 0, got -3" in r.stderr
    r = _run("curate", "a", "b", "--min-len", "nan", cwd=tmp_path)
    assert r.returncode == 2 and "--min-len must be a finite number, got 'nan'" in r.stderr
    # the destination: a file, under a file, SRC itself or inside it; an empty path
    (tmp_path / "src").mkdir()
    (tmp_path / "afile").write_text("x")
    for dst, said in [
        ("afile", "afile: DST is a file, not a directory"),
        ("afile/sub", f"DST cannot be made: {tmp_path / 'afile'} is a file"),
        ("src", "DST src is SRC: a later run over SRC would curate its own clips"),
        ("src/out", "DST src/out is inside SRC src"),
        ("", "DST is empty"),
    ]:
        r = _run("curate", "src", dst, cwd=tmp_path)
        assert r.returncode == 2 and said in r.stderr, (dst, r.stderr)
    # settings that would reject every clip: one error before any work
    r = _run("curate", "a", "b", "--min-len", "5", "--max-len", "2", cwd=tmp_path)
    assert r.returncode == 2 and "max_len_s=2.0 (--max-len) is below min_len_s=5.0" in r.stderr
    r = _run("curate", "a", "b", "--width", "7", cwd=tmp_path)
    assert r.returncode == 2 and "out_width=7 (--width) is below the filters' min_width" in r.stderr
    # a local Ray without CPUs scheduled nothing: the run hung
    r = _run("curate", "a", "b", "--executor", "ray", "--ray-cpus", "0", cwd=tmp_path)
    assert r.returncode == 2 and "--ray-cpus): expected >= 1, got 0" in r.stderr
    r = _run("curate", "a", "b", "--workers", "0", cwd=tmp_path)
    assert r.returncode == 2 and "--workers must be >= 1, got 0" in r.stderr
    r = _run("curate", "a", "b", "--executor", "ray", "--workers", "2", cwd=tmp_path)
    assert r.returncode == 2 and "--workers is for --executor local" in r.stderr


def test_dst_may_not_hold_a_src_video_and_no_videos_is_an_error(tmp_path):
    """DST the folder of a SRC that is one video (its clips landed among the raw videos, found
    as new videos by a run over that folder); ``s3://`` without a bucket; a SRC without videos
    (the flow curated nothing and reported success, as the CLI did not)."""
    from vfm_core.curate.inputs import check_paths, discover_videos
    from vfm_core.storage import StorageError

    raw = tmp_path / "raw"
    raw.mkdir()
    (raw / "a.mp4").write_bytes(b"x")
    video = str(raw / "a.mp4")
    with pytest.raises(ValueError, match=r"DST .*raw holds SRC .*a.mp4: the clips would land"):
        check_paths(video, str(raw))
    assert check_paths(video, str(raw / "out")) == str(raw / "out")  # beside it: the usual
    assert check_paths(video, str(tmp_path / "out")) == str(tmp_path / "out")
    with pytest.raises(ValueError, match=r"SRC s3:// names no bucket"):
        check_paths("s3://", str(tmp_path / "out"))
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(StorageError, match=r"empty: no video files found"):
        discover_videos(str(empty))
