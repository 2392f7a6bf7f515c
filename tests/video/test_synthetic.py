import numpy as np

from vfm_core.video.io import decode_frames, probe
from vfm_core.video.synthetic import (
    Segment,
    VideoSpec,
    demo_spec,
    make_video,
    render_frames,
    score_transitions,
)


def test_ground_truth_layout():
    frames, gt = render_frames(demo_spec())
    assert gt.n_frames == sum(s.n_frames for s in demo_spec().segments) == 400
    assert gt.cuts == (60, 180, 220, 240, 355)
    assert gt.fades == ((110, 122), (300, 320))
    assert gt.kinds[4] == "black" and gt.segments[4] == (220, 240)
    arr = np.stack(list(frames))  # (T, H, W, 3)
    assert arr.shape == (400, 72, 128, 3)
    assert arr[220:240].max() == 0  # black segment
    assert np.array_equal(arr[181], arr[200])  # static segment does not move
    assert not np.array_equal(arr[10], arr[11])  # moving segment moves


def test_deterministic_from_seed():
    a = np.stack(list(render_frames(demo_spec(seed=5))[0]))
    b = np.stack(list(render_frames(demo_spec(seed=5))[0]))
    c = np.stack(list(render_frames(demo_spec(seed=6))[0]))
    assert np.array_equal(a, b) and not np.array_equal(a, c)


def test_make_video_with_caption_and_720p(tmp_path):
    spec = VideoSpec(
        width=1280, height=720, fps=25.0, segments=(Segment(n_frames=5),), caption="a test"
    )
    gt = make_video(tmp_path / "v.mp4", spec)
    assert (tmp_path / "v.txt").read_text().strip() == "a test"
    info = probe(tmp_path / "v.mp4")
    assert (info.width, info.height, info.n_frames, info.fps) == (1280, 720, 5, 25.0)
    assert gt.n_frames == 5 and decode_frames(tmp_path / "v.mp4", width=64).shape == (5, 36, 64, 3)


def test_score_transitions():
    truth = [(10, 10), (30, 42)]
    assert score_transitions([(11, 11), (35, 35)], truth)["f1"] == 1.0
    s = score_transitions([(14, 14), (35, 35), (60, 60)], truth)
    assert s["tp"] == 1 and s["precision"] == 1 / 3 and s["recall"] == 0.5
