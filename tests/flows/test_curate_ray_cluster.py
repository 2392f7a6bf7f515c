"""Curation through the flow on a real Ray cluster (head + one worker node, separate processes)
equals the in-process run; a Ray address with nothing behind it fails in one line, in seconds."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import polars as pl
import pytest
from prefect.states import Failed

from flows.curate import CurateParams, curate_flow
from tasks.curate import curate_ray_task, retry_unless_no_cluster
from tests.flows.ray_cluster import REPO, free_port, ray_cluster
from vfm_core.contracts import Rejects, VideoManifest, read_manifest
from vfm_core.curate import CurateConfig, curate
from vfm_core.curate.executors import RayClusterError, RayExecutor
from vfm_core.curate.pipeline import read_clips
from vfm_core.video.synthetic import demo_spec, make_bad_input, make_video

pytest.importorskip("ray")


@pytest.fixture(scope="module")
def src(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("raw")
    make_video(d / "demo.mp4", demo_spec(seed=3))
    make_bad_input("zero_byte", d / "empty.mp4")
    return d


def _manifests(dst: Path) -> dict[str, pl.DataFrame]:
    clips = read_clips(str(dst))
    return {
        "clips": clips.with_columns(pl.col("uri").str.replace(str(dst), "DST", literal=True)),
        "rejects": read_manifest(dst / "rejects.parquet", Rejects),
        "videos": read_manifest(dst / "videos.parquet", VideoManifest),
    }


def _stage_actor_nodes(address: str) -> set[str]:
    """Nodes that ran the curation stage actors (the GCS keeps dead actors' records)."""
    import ray

    ray.init(address=address, log_to_driver=False)
    try:
        assert sum(n["Alive"] for n in ray.nodes()) == 2
        actors = ray._private.state.actors().values()
        return {a["Address"]["NodeID"] for a in actors if "MapBatches(" in a["ActorClassName"]}
    finally:
        ray.shutdown()


@pytest.mark.slow
def test_curate_flow_on_ray_cluster(prefect_api, src, tmp_path, monkeypatch):
    """~60 s on an idle 2-core machine: two `ray start` nodes (~15 s), the flow, a local run."""
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    cfg = CurateConfig(min_len_s=1.0)
    local = curate(str(src), str(tmp_path / "local"), config=cfg)
    with ray_cluster(workers=1, cpus_per_node=1) as address:
        params = CurateParams(
            src=str(src),
            dst=str(tmp_path / "ray"),
            min_len_s=1.0,
            executor="ray",
            ray_address=address,
        )
        summary = curate_flow(params)
        nodes = _stage_actor_nodes(address)
    assert summary["n_clips"] == local["n_clips"] > 3 and summary["n_rejects"] == local["n_rejects"]
    a, b = _manifests(tmp_path / "local"), _manifests(tmp_path / "ray")
    for name in a:
        assert a[name].equals(b[name]), name
    assert sorted(os.listdir(tmp_path / "ray" / "clips")) == sorted(
        os.listdir(tmp_path / "local" / "clips")
    )
    assert len(nodes) == 2, "the stage actors ran on one node only"


@pytest.mark.slow
def test_curate_flow_no_cluster_fails_fast(prefect_api, src, tmp_path):
    port = free_port()  # nothing listens there
    params = CurateParams(
        src=str(src), dst=str(tmp_path / "out"), executor="ray", ray_address=f"127.0.0.1:{port}"
    )
    t0 = time.monotonic()
    state = curate_flow(params, return_state=True)
    assert state.is_failed() and time.monotonic() - t0 < 30  # ray.init alone: minutes
    assert f"no Ray cluster answers at 127.0.0.1:{port}" in state.message


def test_no_cluster_one_line(src, tmp_path):
    """The task and `vfm curate` name the address and fail within seconds (ray.init alone
    retries for minutes)."""
    with pytest.raises(ValueError, match="expected 'auto', 'HOST:PORT'"):
        RayExecutor(address="head-without-port")  # malformed: refused before any work
    port = free_port()
    cfg = CurateConfig(min_len_s=1.0).to_dict()
    refs = [{"source_uri": str(src / "empty.mp4"), "url": str(src / "empty.mp4")}]
    t0 = time.monotonic()
    with pytest.raises(RayClusterError, match=f"no Ray cluster answers at 127.0.0.1:{port}"):
        curate_ray_task.fn(refs, str(tmp_path / "out"), cfg, address=f"127.0.0.1:{port}")
    assert time.monotonic() - t0 < 10
    # the task is not retried on a wrong address, only on other failures (a node lost mid-run)
    assert not retry_unless_no_cluster(None, None, Failed(data=RayClusterError("x")))
    assert retry_unless_no_cluster(None, None, Failed(data=RuntimeError("node died")))
    env = dict(os.environ, PYTHONPATH=str(REPO), RAY_AUTH_MODE="disabled")
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "vfm_core.cli",
            "curate",
            str(src),
            str(tmp_path / "cli"),
            "--executor",
            "ray",
            "--ray-address",
            f"127.0.0.1:{port}",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip().splitlines() == [
        f"vfm curate: error: no Ray cluster answers at 127.0.0.1:{port} (connection refused); "
        "start one with `ray start --head` or pass the head's HOST:PORT"
    ]
    r = subprocess.run(
        [sys.executable, "-m", "vfm_core.cli", "curate", str(src), "out", "--ray-address", "x:1"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert r.returncode == 2 and "--ray-address needs --executor ray" in r.stderr
