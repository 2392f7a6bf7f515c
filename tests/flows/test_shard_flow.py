"""Shard flow under the Prefect test harness, and the task body on its own (``task.fn``)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
from pydantic import ValidationError

from flows.shard import ShardParams, shard_flow
from tasks.shard import write_shards_task
from vfm_core.data.index import read_index
from vfm_core.video.synthetic import Segment, VideoSpec, make_video


def curation_output(root: Path, n: int = 4, captions: list[str] | None = None) -> Path:
    """A curation-style output dir: clips/*.mp4 + clips.parquet (an image among the clips)."""
    (root / "clips").mkdir(parents=True)
    rows = []
    for i in range(n):
        frames = 1 if i == 0 else 5 + 4 * i
        spec = VideoSpec(width=32, height=32, fps=8.0, seed=i, segments=(Segment(n_frames=frames),))
        make_video(root / "clips" / f"c{i}.mp4", spec)
        rows.append(
            {
                "clip_id": f"c{i}",
                "video_id": "v0",
                "source_uri": "/raw/v0.mp4",
                "start_s": 0.0,
                "end_s": frames / 8,
                "uri": f"clips/c{i}.mp4",
                "caption": captions[i] if captions else f"a red disc moving {i}",
                "width": 32,
                "height": 32,
                "fps": 8.0,
                "n_frames": frames,
            }
        )
    pd.DataFrame(rows).to_parquet(root / "clips.parquet")
    return root


def test_params_validate():
    with pytest.raises(ValidationError, match="greater than 0"):
        ShardParams(clips_dir="a", shards_dir="b", target_shard_mb=0)
    assert ShardParams.model_json_schema()["required"] == ["clips_dir"]  # shards_dir: a default


@pytest.mark.slow
def test_shard_flow_writes_a_valid_index(prefect_api, tmp_path):
    src = curation_output(tmp_path / "cur")
    out = tmp_path / "shards"
    summary = shard_flow(ShardParams(clips_dir=str(src), shards_dir=str(out), target_shard_mb=0.01))
    index = read_index(str(out))
    assert summary["n_samples"] == len(index) == 4 and summary["images"] == 1
    assert summary["n_shards"] == len(index.shards) >= 2
    assert index.embedding_dim == 384  # default caption encoder: all-MiniLM-L6-v2


def test_shard_task_fn_reports_bad_manifest(tmp_path):
    (tmp_path / "cur").mkdir()
    with pytest.raises(ValueError, match=r"clips.parquet: cannot read the clips manifest"):
        write_shards_task.fn(str(tmp_path / "cur"), str(tmp_path / "out"))


@pytest.mark.slow
def test_shard_flow_with_a_query_shards_only_the_matching_clips(prefect_api, tmp_path):
    caps = [
        "a red disc moving left",
        "a white car at night",
        "green leaves in the wind",
        "a black car on a wet road at night",
    ]
    src = curation_output(tmp_path / "cur", captions=caps)
    out = tmp_path / "shards"
    params = ShardParams(
        clips_dir=str(src), shards_dir=str(out), query="cars driving at night", query_top=2
    )
    summary = shard_flow(params)
    index = read_index(str(out))
    assert summary["n_samples"] == len(index) == 2
    assert sorted(index.samples["key"]) == ["c1", "c3"]
    assert (out / "_query" / "clips.parquet").exists() and (out / "_query" / "search.json").exists()


@pytest.mark.slow
def test_library_progress_lines_reach_the_flow_run_log(prefect_api, tmp_path):
    """The library's progress (``vfm_core`` loggers, not the task's own logger) is in the run
    log that the Prefect UI shows: the flows add ``vfm_core`` to Prefect's extra loggers."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId
    from prefect.logging.handlers import APILogHandler

    src = curation_output(tmp_path / "cur")
    params = ShardParams(clips_dir=str(src), shards_dir=str(tmp_path / "s"), target_shard_mb=0.01)
    state = shard_flow(params, return_state=True)
    assert state.is_completed()
    APILogHandler().flush()  # the batched log worker: everything sent
    with get_client(sync_client=True) as client:
        logs = client.read_logs(
            LogFilter(flow_run_id=LogFilterFlowRunId(any_=[state.state_details.flow_run_id]))
        )
    lines = {(log.name, log.message.split(",")[0]) for log in logs}
    assert ("vfm_core.data.shards", "writing shards: 4/4 clips (100%)") in lines, lines
