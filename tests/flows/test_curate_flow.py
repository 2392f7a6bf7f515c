"""Curation flow under the Prefect test harness; task bodies on their own (``task.fn``)."""

from __future__ import annotations

import os
import shutil
import threading
import time
from pathlib import Path

import polars as pl
import pytest
from pydantic import ValidationError

import tasks.curate
from flows.curate import CurateParams, curate_flow
from tasks.curate import curate_video_task, discover_task, write_manifests_task
from vfm_core.contracts import AnnotatedClips, ContractError, Rejects, read_manifest
from vfm_core.curate.executors import share_cpus
from vfm_core.openmp import usable_cpus
from vfm_core.video.synthetic import demo_spec, make_bad_input, make_video


@pytest.fixture(scope="module")
def raw(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("raw")
    make_video(d / "demo.mp4", demo_spec(seed=3))
    make_bad_input("zero_byte", d / "empty.mp4")
    make_bad_input("rotated", d / "sub" / "rot.mp4")
    return d


def test_params_validate():
    with pytest.raises(ValidationError, match="greater than 0"):
        CurateParams(src="a", dst="b", out_fps=0)
    with pytest.raises(ValidationError, match="splitter"):
        CurateParams(src="a", dst="b", splitter="magic")
    with pytest.raises(ValidationError, match="encoder"):
        CurateParams(src="a", dst="b", encoder="x265")
    assert CurateParams(src="a", dst="b", encoder="libx264").config().encoder == "libx264"
    assert {"src", "dst"} <= set(CurateParams.model_json_schema()["required"])
    with pytest.raises(ValidationError, match="executor"):
        CurateParams(src="a", dst="b", executor="spark")
    with pytest.raises(ValidationError, match="max_len_s=2.0 .* is below min_len_s=5.0"):
        CurateParams(src="a", dst="b", min_len_s=5, max_len_s=2)
    with pytest.raises(ValidationError, match="ray_address needs executor 'ray'"):
        CurateParams(src="a", dst="b", ray_address="10.0.0.1:6379")
    with pytest.raises(ValidationError, match="expected 'auto', 'HOST:PORT' or 'ray://HOST:PORT'"):
        CurateParams(src="a", dst="b", executor="ray", ray_address="10.0.0.1")
    for addr in (None, "auto", "head.internal:6379", "ray://10.0.0.1:10001"):
        assert CurateParams(src="a", dst="b", executor="ray", ray_address=addr).ray_address == addr
    props = CurateParams.model_json_schema()["properties"]
    assert not any("<" in str(v.get("description", "")) for v in props.values())  # UI-safe


def test_tasks_directly(raw, tmp_path):
    cfg = CurateParams(src=str(raw), dst="x", min_len_s=1.0).config().to_dict()
    refs = discover_task.fn(str(raw))
    assert [Path(r["source_uri"]).name for r in refs] == ["demo.mp4", "empty.mp4", "rot.mp4"]
    dst = str(tmp_path / "out")
    results = [curate_video_task.fn(r, dst, cfg) for r in refs]
    assert [x["n_clips"] > 0 for x in results] == [True, False, True]
    assert results[1]["n_rejects"] == 1 and not any(x["skipped"] for x in results)
    again = curate_video_task.fn(refs[0], dst, cfg)
    assert again["skipped"] and again["n_clips"] == results[0]["n_clips"]
    summary = write_manifests_task.fn(refs, dst, cfg, results)
    assert summary["n_clips"] == sum(x["n_clips"] for x in results)
    with pytest.raises(ValueError, match="expected a video ref"):
        curate_video_task.fn({"url": "x"}, dst, cfg)
    with pytest.raises(ValueError, match=r"curate.colour: unknown key"):
        curate_video_task.fn(refs[0], dst, {**cfg, "colour": 1})
    # a video lost between curation and the manifest step breaks the coverage contract
    with pytest.raises(ContractError, match="inputs with no clip and no reject"):
        write_manifests_task.fn(
            [*refs, {"source_uri": "ghost.mp4", "url": "/ghost.mp4"}], dst, cfg, results
        )


@pytest.mark.slow
def test_curate_flow_folder_and_rerun(prefect_api, raw, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    src = tmp_path / "in"
    shutil.copytree(raw, src)
    params = CurateParams(src="in", dst="out", min_len_s=1.0)
    running, most = [0], [0]  # videos curated at once: at most the CPUs (threads fight beyond)
    lock = threading.Lock()
    process = tasks.curate._process

    workers: set[int] = set()  # threads of each video's executor: the CPUs the others leave

    def counted(*args, **kwargs):
        with lock:
            workers.add(args[3].workers)
            running[0] += 1
            most[0] = max(most[0], running[0])
        try:
            time.sleep(0.2)  # long enough that unbounded tasks would overlap
            return process(*args, **kwargs)
        finally:
            with lock:
                running[0] -= 1

    monkeypatch.setattr(tasks.curate, "_process", counted)
    summary = curate_flow(params)
    assert curate_flow.task_runner._max_workers == usable_cpus()
    assert 1 <= most[0] <= usable_cpus()
    assert workers == {share_cpus(3)}
    clips = read_manifest(tmp_path / "out" / "clips.parquet", AnnotatedClips)
    rejects = read_manifest(tmp_path / "out" / "rejects.parquet", Rejects)
    assert summary["n_inputs"] == 3 and summary["n_clips"] == clips.height > 3
    assert set(clips["source_uri"]) | set(rejects["source_uri"]) == {
        "in/demo.mp4",
        "in/empty.mp4",
        "in/sub/rot.mp4",
    }
    assert rejects.filter(pl.col("source_uri") == "in/empty.mp4")["stage"].to_list() == ["probe"]
    assert all(os.path.exists(u) for u in clips["uri"])
    from prefect.artifacts import Artifact  # the run page's bar counted the 3 videos

    bar = Artifact.get("curate-progress")
    assert bar is not None and bar.type == "progress" and float(bar.data) == 100.0
    again = curate_flow(params)
    assert again["n_skipped"] == 3 and again["n_clips"] == summary["n_clips"]


def test_a_curation_that_rejects_every_video_fails_with_the_count(prefect_api, tmp_path):
    src = tmp_path / "bad"
    make_bad_input("zero_byte", src / "empty.mp4")
    make_bad_input("not_video", src / "notes.mp4")
    state = curate_flow(CurateParams(src=str(src), dst=str(tmp_path / "out")), return_state=True)
    assert state.is_failed()
    assert state.message.startswith(
        "Flow run encountered an exception: CurationFailed: curation of"
    )
    assert "2 videos produced no clip: every input was rejected (2 rejects" in state.message
    assert read_manifest(tmp_path / "out" / "rejects.parquet", Rejects).height == 2  # kept
