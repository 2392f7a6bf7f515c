"""H.264 encoder selection: auto picks NVENC where it opens, else libx264 with the reason logged."""

import logging

import av
import pytest

from vfm_core.curate.clip_stages import TranscodeStage
from vfm_core.curate.config import CurateConfig
from vfm_core.video.io import decode_frames, probe
from vfm_core.video.transcode import (
    EncoderError,
    encoder_unavailable,
    select_encoder,
    transcode_span,
)

NVENC_WHY = encoder_unavailable("h264_nvenc")
needs_no_nvenc = pytest.mark.skipif(NVENC_WHY is None, reason="h264_nvenc opens here")


def _first_packet_is_key(path) -> bool:
    with av.open(str(path)) as c:
        return next(c.demux(c.streams.video[0])).is_keyframe


def test_unknown_encoder_names_the_setting():
    with pytest.raises(EncoderError, match=r"CurateConfig.encoder: unknown encoder 'x265'"):
        select_encoder("x265", setting="CurateConfig.encoder")
    assert select_encoder("libx264") == "libx264"


def test_codec_missing_from_build_is_reported():
    why = encoder_unavailable("h264_no_such_encoder")
    assert why is not None and "has no h264_no_such_encoder encoder" in why
    assert encoder_unavailable("libx264") is None  # the wheel's encoder opens everywhere


@needs_no_nvenc
def test_auto_falls_back_to_libx264_and_logs_why(caplog, demo_video, tmp_path):
    with caplog.at_level(logging.INFO, logger="vfm_core.video.transcode"):
        assert select_encoder("auto", setting="CurateConfig.encoder") == "libx264"
    msg = " ".join(r.getMessage() for r in caplog.records)
    assert "CurateConfig.encoder=auto: using libx264" in msg and NVENC_WHY in msg
    r = transcode_span(demo_video[0], tmp_path / "a.mp4", 1.0, 2.0, encoder="auto")
    assert r.encoder == "libx264" and r.n_frames == 24
    assert b"x264" in (tmp_path / "a.mp4").read_bytes()  # libx264's SEI banner
    assert _first_packet_is_key(tmp_path / "a.mp4")


@needs_no_nvenc
def test_nvenc_requested_but_unavailable_is_a_clear_error(demo_video, tmp_path):
    with pytest.raises(EncoderError, match=r"CurateConfig.encoder='h264_nvenc' is unavailable"):
        select_encoder("h264_nvenc", setting="CurateConfig.encoder")
    with pytest.raises(EncoderError, match=r"transcode_span\(encoder=...\)='h264_nvenc'"):
        transcode_span(demo_video[0], tmp_path / "n.mp4", 1.0, 2.0, encoder="h264_nvenc")
    assert not (tmp_path / "n.mp4").exists()
    # in the pipeline it fails the run at stage setup, not each clip as a reject
    stage = TranscodeStage(cfg=CurateConfig(encoder="h264_nvenc"), dst=str(tmp_path), work_dir="w")
    with pytest.raises(EncoderError, match="CurateConfig.encoder"):
        stage.setup()


def test_encoder_setting_changes_clip_ids():
    a, b = CurateConfig(), CurateConfig(encoder="libx264")
    assert a.encoder == "auto" and a.clip_settings() != b.clip_settings()
    assert CurateConfig.from_dict(b.to_dict()).encoder == "libx264"


@pytest.mark.gpu
def test_nvenc_encodes_on_gpu(demo_video, tmp_path):
    if NVENC_WHY is not None:
        pytest.skip(NVENC_WHY)
    assert select_encoder("auto") == "h264_nvenc"
    out = tmp_path / "g.mp4"
    r = transcode_span(demo_video[0], out, 1.0, 3.0, encoder="h264_nvenc", crf=20)
    assert r.encoder == "h264_nvenc" and r.n_frames == 48
    assert b"x264" not in out.read_bytes() and _first_packet_is_key(out)
    info = probe(out)
    assert (info.codec, info.n_frames, info.width, info.height) == ("h264", 48, 128, 72)
    assert decode_frames(out).shape == (48, 72, 128, 3)
