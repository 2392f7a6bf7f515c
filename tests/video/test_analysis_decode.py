"""The shot splitter's fast analysis decode (no deblocking loop filter) keeps its detections."""

import dataclasses

import numpy as np

from vfm_core.video.frame_features import compute_features
from vfm_core.video.io import SKIP_LOOP_FILTER, iter_frames
from vfm_core.video.shots import ColorChangeSplitter
from vfm_core.video.spans import LengthRules, transitions_from_spans
from vfm_core.video.synthetic import demo_spec, make_video, score_transitions

ALL = LengthRules(min_len_s=0.0, max_len_s=None)


def test_fast_analysis_decode_finds_the_same_cuts_and_fades(video_dir):
    """demo_spec (5 hard cuts, 2 dissolves, a static and a black shot) encoded by x264 veryfast,
    i.e. deblocked like camera and web video (the session's ultrafast videos are not)."""
    spec = dataclasses.replace(demo_spec(width=320, height=180, seed=0), preset="veryfast")
    path = video_dir / "demo_deblocked.mp4"
    gt = make_video(path, spec)
    full = compute_features(path)
    fast = compute_features(path, decoder_options=SKIP_LOOP_FILTER)
    # the option reaches the decoder: the analysis frames differ, by a little
    assert not np.array_equal(full.thumbs, fast.thumbs)
    assert 0 < 0.5 * np.abs(fast.hist - full.hist).sum(1).mean() < 0.05
    # ... and the splitter (fast decode by default) finds every cut and dissolve, as the full
    # decode does; a transition may change form (a dissolve whose change dips near the
    # thresholds: a cut at 312 inside the dissolve [300, 320) vs a run [312, 320)), not place
    sp = ColorChangeSplitter(lengths=ALL, drop_black=False)
    assert sp.skip_loop_filter
    fast_t = transitions_from_spans(sp.split(path))
    full_t = transitions_from_spans(dataclasses.replace(sp, skip_loop_filter=False).split(path))
    for pred in (fast_t, full_t):
        s = score_transitions(pred, gt.transitions(), tol=2)
        assert s["precision"] == 1.0 and s["recall"] == 1.0, (s, pred)
    s = score_transitions(fast_t, full_t, tol=0)  # one-to-one: same cuts, overlapping fades
    assert s["precision"] == 1.0 and s["recall"] == 1.0, (fast_t, full_t)


def test_fast_analysis_decode_is_exact_without_deblocking(demo_video):
    path, _ = demo_video  # x264 ultrafast switches deblocking off: nothing to skip
    full = [a for _, a in iter_frames(path, width=64, resize="sample")]
    fast = iter_frames(path, width=64, resize="sample", decoder_options=SKIP_LOOP_FILTER)
    np.testing.assert_array_equal(np.stack(full), np.stack([a for _, a in fast]))
