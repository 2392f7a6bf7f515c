"""Busy actors and pool sizes per stage from a hand-made event list; a tiny Ray run records
events for every stage."""

from __future__ import annotations

import pytest

from tests.curate.conftest import CFG, assert_covered
from vfm_core.curate.balance import (
    BatchEvent,
    busy_timeline,
    pool_timeline,
    stage_order,
    step_counts,
    summarize,
)

T = 1000.0  # wall-clock origin: timelines are relative to the first event


def ev(stage: str, actor: str, kind: str, start: float, end: float) -> BatchEvent:
    return BatchEvent(
        stage=stage,
        actor=actor,
        kind=kind,
        start=T + start,
        end=T + end,
        n_in=int(kind == "batch"),
        n_out=int(kind == "batch"),
    )


# probe: actor a (setup 0-1, batches 1-2 and 2-3: back to back), actor b (batch 1.5-2.5);
# split: actor c (batch 2-4); Ray's table: a in the pool 0-3.5, b 1.25-3, c 1.75-4
BATCHES = [
    ev("probe", "a", "setup", 0, 1),
    ev("probe", "a", "batch", 1, 2),
    ev("probe", "a", "batch", 2, 3),
    ev("probe", "b", "batch", 1.5, 2.5),
    ev("split", "c", "batch", 2, 4),
]
ACTORS = [
    ev("probe", "a", "actor", 0, 3.5),
    ev("probe", "b", "actor", 1.25, 3),
    ev("split", "c", "actor", 1.75, 4),
]


def test_step_counts_half_open_and_empty():
    assert step_counts([(0, 1), (1, 2), (0.5, 1.5), (3, 3)]) == [(0, 1), (0.5, 2), (1.5, 1), (2, 0)]
    assert step_counts([]) == []


def test_busy_and_pool_timelines():
    events = ACTORS + BATCHES
    assert stage_order(events) == ["probe", "split"]
    # a's two batches touch at 2: one busy actor throughout, no step
    assert busy_timeline(events) == {
        "probe": [(1, 1), (1.5, 2), (2.5, 1), (3, 0)],
        "split": [(2, 1), (4, 0)],
    }
    assert pool_timeline(events) == {
        "probe": [(0, 1), (1.25, 2), (3, 1), (3.5, 0)],
        "split": [(1.75, 1), (4, 0)],
    }
    # without Ray's table: an actor is in the pool from its setup to its last batch
    assert pool_timeline(BATCHES) == {
        "probe": [(0, 1), (1.5, 2), (2.5, 1), (3, 0)],
        "split": [(2, 1), (4, 0)],
    }


def test_summarize_and_json():
    s = summarize(ACTORS + BATCHES)
    assert list(s) == ["probe", "split"]
    p, q = s["probe"], s["split"]
    assert (p.batches, p.busy_s, p.setup_s, p.actors, p.max_busy, p.max_pool) == (3, 3, 1, 2, 2, 2)
    assert (q.batches, q.busy_s, q.actors, q.max_busy, q.max_pool) == (1, 2, 1, 1, 1)
    assert (p.share, q.share) == (pytest.approx(0.6), pytest.approx(0.4))
    assert all(BatchEvent.from_json(e.to_json()) == e for e in ACTORS + BATCHES)


@pytest.mark.slow
def test_ray_run_records_every_stage(tmp_path, monkeypatch):
    """~30 s on an idle 2-core machine (Ray start + one actor per stage)."""
    pytest.importorskip("ray")
    from vfm_core.curate import RayExecutor, curate
    from vfm_core.video.synthetic import Segment, VideoSpec, make_video

    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    src = tmp_path / "src"
    src.mkdir()
    segs = (Segment(kind="moving", n_frames=36), Segment(kind="pan", n_frames=36))
    make_video(src / "two_shots.mp4", VideoSpec(segments=segs, seed=3))
    ex = RayExecutor(num_cpus=2, pool_size=1, record_events=True)
    out = curate(str(src), str(tmp_path / "dst"), config=CFG, executor=ex)
    stages = ["probe", "split", "stitch", "transcode", "annotate"]
    assert out["n_clips"] + out["n_rejects"] == 2
    assert_covered(tmp_path / "dst")
    assert stage_order(ex.events) == stages
    s = summarize(ex.events)
    batches = {k: v.batches for k, v in s.items()}
    assert batches == {"probe": 1, "split": 1, "stitch": 1, "transcode": 2, "annotate": 2}
    kinds = {(e.stage, e.kind) for e in ex.events}
    assert {(st, k) for st in stages for k in ("actor", "setup", "batch")} <= kinds
    assert all(v.max_pool == v.actors == 1 and v.busy_s > 0 for v in s.values())
