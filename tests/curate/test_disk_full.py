"""A disk that fills during curation (#27 part 2, d), on a real full disk: ``DST`` on a tmpfs
mounted with a few hundred kB (needs root and ``mount``; skipped elsewhere), then grown with
``mount -o remount,size=...`` as a person frees space. No fault injection.

A write that meets ENOSPC leaves no half-written sibling (``*.tmp-PID``) and the file it
replaces intact; the manifests are written only after every video is done; a clip whose encode
meets a full disk fails the run as a storage error (never a ``transcode`` reject of a finished
video), so the rerun after space is freed curates that video again and loses no clip."""

from __future__ import annotations

import errno
import shutil
from pathlib import Path

import pytest

from tests.curate.conftest import CFG, assert_covered
from vfm_core import storage


def test_a_write_on_a_full_disk_leaves_no_half_file(small_disk):
    mnt, _ = small_disk
    target = mnt / "_state" / "video.json"
    storage.write_bytes(str(target), b"old state")
    with pytest.raises(OSError) as e:
        storage.write_bytes(str(target), b"x" * 400_000)
    assert e.value.errno == errno.ENOSPC
    assert target.read_bytes() == b"old state"  # the file it would replace: intact
    assert sorted(p.name for p in target.parent.iterdir()) == ["video.json"]
    with pytest.raises(OSError):
        storage.put_file(_big(mnt.parent), str(mnt / "clips" / "big.mp4"))
    assert list((mnt / "clips").iterdir()) == []


def _big(root: Path) -> Path:
    path = root / "big.bin"
    path.write_bytes(b"y" * 400_000)
    return path


@pytest.mark.slow
def test_a_video_that_met_a_full_disk_is_curated_again(small_disk, tmp_path):
    from vfm_core.contracts import Rejects, read_manifest
    from vfm_core.curate.pipeline import curate
    from vfm_core.video.synthetic import demo_spec, make_video

    mnt, resize = small_disk
    src = tmp_path / "src"  # three ~17 s demo videos: ~450 kB of clips and states
    src.mkdir()
    for seed in range(3):
        make_video(src / f"demo{seed}.mp4", demo_spec(seed=seed))
    dst = mnt / "out"
    # the disk fills at some point of the run: at a clip's encode (the case under test) or at a
    # state write, depending on the sizes; the first size whose run meets it at an encode is used
    for size in ("120k", "160k", "200k", "240k", "280k", "320k"):
        shutil.rmtree(dst, ignore_errors=True)
        resize(size)
        met = None
        try:
            curate(str(src), str(dst), config=CFG, progress=False)
        except OSError as e:  # the run stops: at a clip's encode (disk full) or a state write
            assert e.errno == errno.ENOSPC or "disk full" in str(e), e
            met = str(e)
        assert not list(dst.rglob("*.tmp-*")), list(dst.rglob("*.tmp-*"))  # no half file
        states = [p.read_text() for p in (dst / "_state").glob("*.json")]
        assert not any("No space left" in st for st in states)  # never a finished reject
        assert not (dst / "clips.parquet").exists()  # no manifest of a failed run
        if met and "disk full" in met:
            break
    else:
        pytest.skip("no disk size made an encode meet ENOSPC with these clips")
    resize("20m")  # space freed: the same command again
    out = curate(str(src), str(dst), config=CFG, progress=False)
    ref = curate(str(src), str(tmp_path / "ref"), config=CFG, progress=False)
    assert out["n_clips"] == ref["n_clips"] and out["n_rejects"] == ref["n_rejects"]
    rejects = read_manifest(str(dst / "rejects.parquet"), Rejects)
    assert not any("No space left" in r for r in rejects["reason"].to_list())
    assert_covered(dst)
