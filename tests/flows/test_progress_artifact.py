"""The progress artifact's arithmetic and its quiet life outside a run (the flows' tests read the
real artifact through the Prefect API)."""

from __future__ import annotations

from tasks.progress import ProgressArtifact


def test_outside_a_run_it_follows_step_lines_without_an_api():
    bar = ProgressArtifact("train-progress", 10, description="steps", every_s=0.0)
    assert bar.id is None  # no flow or task run: nothing created, nothing raised
    bar.feed_line("step 3/8 loss 0.52 1650 tokens/s")
    assert (bar.total, bar.percent) == (8, 37.5)
    bar.feed_line("checkpoint: runs/x/step-000003")  # other lines change nothing
    assert bar.percent == 37.5
    bar.update(99)
    assert bar.percent == 100.0
