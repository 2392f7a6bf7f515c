"""The Ray Data executor (local instance, 2 CPUs) gives the same manifests as the in-process one."""

from __future__ import annotations

import os

import polars as pl
import pytest
from polars.testing import assert_frame_equal

from tests.curate.conftest import CFG, assert_covered
from vfm_core.contracts import Rejects, VideoManifest, read_manifest
from vfm_core.curate import RayExecutor, curate
from vfm_core.curate.pipeline import read_clips

pytest.importorskip("ray")


def _manifests(dst) -> dict[str, pl.DataFrame]:
    clips = read_clips(str(dst))
    clips = clips.with_columns(pl.col("uri").str.replace(str(dst), "DST", literal=True))
    return {
        "clips": clips,
        "rejects": read_manifest(dst / "rejects.parquet", Rejects),
        "videos": read_manifest(dst / "videos.parquet", VideoManifest),
    }


@pytest.mark.slow
def test_ray_executor_same_manifests_as_local(good_dir, bad_dir, tmp_path, monkeypatch):
    """~50 s on an idle 2-core machine: Ray start (~10 s) + one actor pool per stage."""
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    src = tmp_path / "src"
    src.mkdir()
    demo0 = [p for p in good_dir[0].iterdir() if p.stem == "demo0"]  # video + sidecar
    for p in [*demo0, bad_dir / "zero_byte.mp4", bad_dir / "rotated.mp4"]:
        os.link(p, src / p.name)
    local = curate(str(src), str(tmp_path / "local"), config=CFG)
    ray_ = curate(
        str(src), str(tmp_path / "ray"), config=CFG, executor=RayExecutor(num_cpus=2, max_workers=2)
    )
    assert ray_["n_clips"] == local["n_clips"] > 5 and ray_["n_rejects"] == local["n_rejects"]
    assert_covered(tmp_path / "ray")
    a, b = _manifests(tmp_path / "local"), _manifests(tmp_path / "ray")
    for name in a:
        assert a[name].columns == b[name].columns, name
        # exact everywhere; floats to 1e-6 (Ray moves rows through Arrow batches), and a failure
        # names the columns and rows that differ
        assert_frame_equal(a[name], b[name], check_exact=False, rel_tol=1e-6, abs_tol=1e-7)
    assert sorted(os.listdir(tmp_path / "ray" / "clips")) == sorted(
        os.listdir(tmp_path / "local" / "clips")
    )
