"""H.264 encoder selection: auto picks NVENC where it opens, else libx264 with the reason logged."""

import logging

import av
import numpy as np
import pytest

from vfm_core.curate import curate
from vfm_core.curate.clip_stages import TranscodeStage
from vfm_core.curate.config import CurateConfig
from vfm_core.video import transcode
from vfm_core.video.io import decode_frames, decoder_threads, iter_av_frames, probe
from vfm_core.video.synthetic import Segment, VideoSpec, make_video
from vfm_core.video.transcode import (
    EncoderError,
    encode_h264,
    encoder_unavailable,
    select_encoder,
    transcode_span,
    x264_threads,
)

NVENC_WHY = encoder_unavailable("h264_nvenc")
needs_no_nvenc = pytest.mark.skipif(NVENC_WHY is None, reason="h264_nvenc opens here")


@pytest.fixture
def fresh_process(monkeypatch):
    """No encoder choice logged yet, as in a new process."""
    monkeypatch.setattr(transcode, "_CHOICES_LOGGED", set())


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
def test_auto_falls_back_to_libx264_and_logs_why(caplog, demo_video, tmp_path, fresh_process):
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


class _Said(logging.Handler):
    """Every record its logger emits, once each (a handler on the emitting logger itself: root
    handlers may see a record twice where an earlier test of the worker forwards records)."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def test_encoder_choice_is_logged_once_per_process(tmp_path, fresh_process):
    """Two curation runs, three videos, several clips each: one line says which encoder."""
    src = tmp_path / "src"
    segs = tuple(Segment(kind=k, n_frames=36) for k in ("moving", "pan", "moving"))
    for seed in (0, 1):
        make_video(src / f"v{seed}.mp4", VideoSpec(width=96, height=64, seed=seed, segments=segs))
    cfg = CurateConfig(min_len_s=1.0)
    logger, seen = logging.getLogger("vfm_core.video.transcode"), _Said()
    level = logger.level
    logger.addHandler(seen)
    logger.setLevel(logging.INFO)
    try:
        one = curate(str(src / "v0.mp4"), str(tmp_path / "one"), config=cfg)
        both = curate(str(src), str(tmp_path / "both"), config=cfg)
    finally:
        logger.removeHandler(seen)
        logger.setLevel(level)
    assert one["n_clips"] >= 2 and both["n_clips"] >= 4
    said = [r.getMessage() for r in seen.records if "=auto: using" in r.getMessage()]
    assert len(said) == 1, said
    assert said[0].startswith("CurateConfig.encoder=auto: using ")


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


def test_small_pictures_are_encoded_and_decoded_on_one_thread(tmp_path):
    """x264's and the decoder's frame threads cost more than they win on small pictures
    (measured in `io.ONE_THREAD_PIXELS`); larger ones keep the automatic count. The clip
    decodes to the same pixels on one thread as on the automatic count."""
    assert x264_threads(160, 90) == 1 and x264_threads(256, 256) == 1
    assert x264_threads(1280, 720) == 0 and x264_threads(480, 204) == 0
    assert (
        decoder_threads("AUTO", 160, 90) == "NONE" and decoder_threads("AUTO", 256, 256) == "NONE"
    )
    assert (
        decoder_threads("AUTO", 480, 204) == "AUTO" and decoder_threads("SLICE", 16, 16) == "SLICE"
    )
    frames = np.random.default_rng(0).integers(0, 255, (6, 90, 160, 3), dtype=np.uint8)
    assert encode_h264(frames, tmp_path / "small.mp4", fps=25) == 6
    assert probe(str(tmp_path / "small.mp4")).n_frames == 6
    one = [
        f.to_ndarray()
        for _, f in iter_av_frames(tmp_path / "small.mp4", start_s=None, end_s=None, threads="AUTO")
    ]
    many = [
        f.to_ndarray()
        for _, f in iter_av_frames(
            tmp_path / "small.mp4", start_s=None, end_s=None, threads="FRAME"
        )
    ]
    assert len(one) == 6 and all(np.array_equal(a, b) for a, b in zip(one, many, strict=True))
