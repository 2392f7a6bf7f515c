import io

import numpy as np
import pytest

from vfm_core.video.io import VideoError, decode_frames, iter_frames, lost_tail, probe
from vfm_core.video.synthetic import demo_spec, render_frames
from vfm_core.video.transcode import encode_h264, transcode_span


def _psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2)
    return float(10 * np.log10(255.0**2 / max(mse, 1e-12)))


def test_probe_demo(demo_video):
    path, gt = demo_video
    info = probe(path)
    assert info.has_video and not info.vfr and info.rotation == 0
    assert (info.width, info.height, info.codec, info.pix_fmt) == (128, 72, "h264", "yuv420p")
    assert info.fps == 24.0 and info.n_frames == gt.n_frames
    assert info.duration_s == pytest.approx(gt.n_frames / 24.0, abs=0.05)


def test_encode_decode_roundtrip(tmp_path):
    frames = np.stack(list(render_frames(demo_spec())[0]))[:48]  # (48, 72, 128, 3)
    n = encode_h264(frames, tmp_path / "r.mp4", fps=24, crf=12)
    back = decode_frames(tmp_path / "r.mp4")
    assert n == 48 and back.shape == frames.shape
    assert _psnr(frames, back) > 30
    small = decode_frames(tmp_path / "r.mp4", width=64)
    sampled = decode_frames(tmp_path / "r.mp4", width=64, resize="sample")
    assert small.shape == sampled.shape == (48, 36, 64, 3)
    assert _psnr(small, sampled) > 20  # point sampling vs swscale: same picture


def test_file_object_and_span_decode(demo_video):
    path, _ = demo_video
    with open(path, "rb") as f:
        assert probe(f).n_frames == 400
        ts = [t for t, _ in iter_frames(f, width=32, start_s=2.0, end_s=3.0)]
    assert len(ts) == 24 and ts[0] == pytest.approx(2.0) and ts[-1] == pytest.approx(3 - 1 / 24)
    buf = io.BytesIO(path.read_bytes())
    assert decode_frames(buf, width=32, start_s=10.0).shape[0] == 400 - 240


def test_every_nth_frame_is_the_full_decode_sampled(demo_video):
    """`every=k` converts only frames 0, k, 2k... of the range: the same arrays as the full
    decode indexed with [::k] (what the curation filters score)."""
    path, _ = demo_video
    full = decode_frames(path, width=32, start_s=2.0, end_s=5.0)  # (72, 18, 32, 3)
    assert np.array_equal(decode_frames(path, width=32, start_s=2.0, end_s=5.0, every=3), full[::3])


def test_transcode_span_of_frames_decoded_once(demo_video, tmp_path):
    """Frames already decoded (`frames=`) give the same clip bytes as the span decoded inside."""
    from vfm_core.video.io import iter_av_frames

    path, _ = demo_video
    transcode_span(path, tmp_path / "a.mp4", 2.5, 4.5, encoder="libx264")
    span = list(iter_av_frames(path, start_s=2.5, end_s=4.5, threads="AUTO"))
    transcode_span(path, tmp_path / "b.mp4", 2.5, 4.5, encoder="libx264", frames=span)
    assert (tmp_path / "a.mp4").read_bytes() == (tmp_path / "b.mp4").read_bytes()


def test_transcode_span(demo_video, tmp_path):
    path, _ = demo_video
    full = decode_frames(path)
    r = transcode_span(path, tmp_path / "c.mp4", 2.5, 4.5)
    assert (r.n_frames, r.width, r.height) == (48, 128, 72)
    info = probe(tmp_path / "c.mp4")
    assert info.n_frames == 48 and info.duration_s == pytest.approx(2.0, abs=0.05)
    clip = decode_frames(tmp_path / "c.mp4")
    assert _psnr(clip[0], full[60]) > 28 and _psnr(clip[-1], full[107]) > 28
    import av

    with av.open(str(tmp_path / "c.mp4")) as c:
        first = next(c.demux(c.streams.video[0]))
        assert first.is_keyframe
    r2 = transcode_span(path, tmp_path / "d.mp4", 1.0, 3.0, width=64, fps=12)
    assert (r2.width, r2.height, r2.fps) == (64, 36, 12.0) and r2.n_frames == 24


@pytest.mark.parametrize(
    ("kind", "reason"),
    [
        ("zero_byte", "empty file"),
        ("truncated", r"MP4 without its index \(no moov box\): the recording stopped"),
        ("truncated_faststart", "truncated"),
        ("not_video", "not a readable media file"),
        ("audio_only", "no video stream"),
        ("cover_art", r"no video stream \(audio and a cover picture only\)"),
    ],
)
def test_bad_inputs_raise(bad_inputs, kind, reason):
    with pytest.raises(VideoError, match=reason) as e:
        probe(bad_inputs[kind])
    assert e.value.path.endswith(f"bad_{kind}.mp4") and e.value.reason


def test_truncated_probe_allowed_states_the_whole_file(bad_inputs):
    """allow_truncated: the prefix decodes, the stated duration stays; lost_tail names why
    decoding ends early. The strict probe's error carries the stated seconds."""
    path = bad_inputs["truncated_faststart"]
    with pytest.raises(VideoError, match="truncated: sample index needs") as e:
        probe(path)
    assert e.value.duration_s == pytest.approx(2.0)
    info = probe(path, allow_truncated=True)
    assert (info.duration_s, info.n_frames) == (pytest.approx(2.0), 48)
    times = [t for t, _ in iter_frames(path, width=32)]
    assert 0 < len(times) < 48
    assert lost_tail(path, after_s=times[-1]).startswith("truncated: sample index needs")
    whole = bad_inputs["rotated"]
    assert lost_tail(whole, after_s=1.0) is None  # decodes to its end


def test_audio_only_probe_without_requirement(bad_inputs):
    info = probe(bad_inputs["audio_only"], require_video=False)
    assert not info.has_video and info.duration_s > 0.5


def test_missing_and_huge(tmp_path, demo_video):
    with pytest.raises(VideoError, match="file not found"):
        probe(tmp_path / "nope.mp4")
    with pytest.raises(VideoError, match="exceeds"):
        probe(demo_video[0], max_pixels=100 * 50)


def test_valid_unusual_inputs(bad_inputs):
    one = probe(bad_inputs["one_frame"])
    assert one.n_frames == 1 and decode_frames(bad_inputs["one_frame"]).shape == (1, 64, 96, 3)
    vfr = probe(bad_inputs["vfr"])
    assert vfr.vfr and decode_frames(bad_inputs["vfr"], width=32).shape[0] == 48
    assert probe(bad_inputs["rotated"]).rotation == 90
    assert probe(bad_inputs["yuv444"]).pix_fmt == "yuv444p"
    assert probe(bad_inputs["10bit"]).pix_fmt == "yuv420p10le"
    for k in ("yuv444", "10bit"):
        a = decode_frames(bad_inputs[k], width=48, resize="sample")  # falls back for 10-bit
        assert a.shape == (48, 32, 48, 3) and a.dtype == np.uint8
