"""A truncated or damaged file is salvaged (issue #49): its decodable prefix is curated as usual,
the lost tail is one reject row up to the duration the container states, naming the cause, and
clips + rejects cover every stated second. A file where no frame decodes is one reject of its
stated seconds."""

from __future__ import annotations

from pathlib import Path

import av
import polars as pl
import pytest

from tests.curate.conftest import assert_covered
from vfm_core.contracts import Rejects, VideoManifest, read_manifest
from vfm_core.curate import CurateConfig, curate
from vfm_core.curate.pipeline import read_clips
from vfm_core.video.io import (
    collect_gaps,
    count_frames,
    decode_frames,
    iter_av_frames,
    lost_tail,
    probe,
)
from vfm_core.video.synthetic import (
    Segment,
    VideoSpec,
    make_bad_input,
    make_truncated,
    make_video,
    render_frames,
)
from vfm_core.video.transcode import encode_h264

FPS = 24.0
SPEC = VideoSpec(
    width=96,
    height=64,
    fps=FPS,
    seed=2,
    segments=(  # 6 s: three 2 s shots joined by cuts
        Segment(kind="moving", n_frames=48),
        Segment(kind="pan", n_frames=48),
        Segment(kind="moving", n_frames=48),
    ),
)
CFG = CurateConfig(min_len_s=1.0)


@pytest.fixture(scope="module")
def cut_short(tmp_path_factory) -> Path:
    """SPEC with 70% of its media data: the index states 6 s, about 4 s decode."""
    return make_truncated(tmp_path_factory.mktemp("trunc") / "cut.mp4", SPEC, keep=0.7)


def test_truncated_prefix_is_curated_and_tail_is_one_reject(cut_short, tmp_path):
    dst = tmp_path / "o"
    out = curate(str(cut_short), str(dst), config=CFG)
    clips = read_clips(str(dst))
    rejects = read_manifest(dst / "rejects.parquet", Rejects)
    videos = read_manifest(dst / "videos.parquet", VideoManifest)
    assert videos["duration_s"].to_list() == [pytest.approx(6.0)]
    decodable_s = count_frames(cut_short).decoded / FPS  # about 4.3 s
    assert 3.0 < decodable_s < 5.0
    # clips from the prefix (the two whole shots), each decodes to the frames its row states
    assert clips["start_s"].to_list() == pytest.approx([0.0, 2.0], abs=2 / FPS)
    for row in clips.iter_rows(named=True):
        assert row["end_s"] <= decodable_s and probe(row["uri"]).n_frames == row["n_frames"]
        assert len(decode_frames(row["uri"], width=32)) == row["n_frames"]
    # the lost tail: one reject, from the last decoded frame to the stated 6 s, naming the cause
    tail = rejects.filter(pl.col("reason").str.contains("lost tail"))
    (row,) = tail.to_dicts()
    assert row["stage"] == "split" and row["reason"].startswith("truncated: sample index needs")
    assert (row["start_s"], row["end_s"]) == (pytest.approx(decodable_s), pytest.approx(6.0))
    # every stated second is in a clip or a reject, and the summary counts both
    assert_covered(dst)
    assert out["coverage_gaps"] == []
    assert out["clip_s"] + out["rejected_s"] == pytest.approx(6.0, abs=2 / FPS)


def test_truncated_before_any_frame_is_one_reject_of_the_stated_seconds(tmp_path):
    src = make_truncated(tmp_path / "header_only.mp4", SPEC, keep=0.0)
    out = curate(str(src), str(tmp_path / "o"), config=CFG)
    (row,) = read_manifest(tmp_path / "o" / "rejects.parquet", Rejects).to_dicts()
    assert out["n_clips"] == 0 and row["stage"] == "probe"
    assert row["reason"].startswith("truncated: sample index needs")
    assert row["reason"].endswith("no frame decodes")
    assert (row["start_s"], row["end_s"]) == (0.0, pytest.approx(6.0))
    assert out["rejected_s"] == pytest.approx(6.0)


def test_truncated_prefix_without_a_shot_is_its_own_reject(tmp_path):
    """2 s stated, under 1 s decodes: the prefix is the usual "no shot" reject, the tail another."""
    src = make_bad_input("truncated_faststart", tmp_path / "tf.mp4")
    out = curate(str(src), str(tmp_path / "o"), config=CFG)
    rows = read_manifest(tmp_path / "o" / "rejects.parquet", Rejects).to_dicts()
    assert out["n_clips"] == 0 and [r["stage"] for r in rows] == ["split", "split"]
    head, tail = rows
    assert head["reason"].startswith("no shot of at least 1 s: all 1 shot(s) shorter")
    assert "frames decode of the video's 2.00 s" in head["reason"]
    assert tail["reason"].startswith("truncated: sample index needs")
    assert "lost tail" in tail["reason"]
    assert head["start_s"] == 0.0 and head["end_s"] == tail["start_s"] < 1.0
    assert tail["end_s"] == pytest.approx(2.0)
    assert_covered(tmp_path / "o")


def _zero_sample(path: Path, k: int) -> None:
    """Overwrite the bytes of sample `k` with zeros (its index entry stays): the decoder fails
    there, mid-stream, though the file is whole."""
    with av.open(str(path)) as c:
        entry = c.streams.video[0].index_entries[k]
    data = bytearray(path.read_bytes())
    data[entry.pos : entry.pos + entry.size] = bytes(entry.size)
    path.write_bytes(bytes(data))


def test_decoder_error_mid_stream_keeps_what_decodes(tmp_path):
    src = tmp_path / "damaged.mp4"
    make_video(src, SPEC)
    _zero_sample(src, 100)  # frame 100 of 144: 4.17 s
    out = curate(str(src), str(tmp_path / "o"), config=CFG)
    clips = read_clips(str(tmp_path / "o"))
    rejects = read_manifest(tmp_path / "o" / "rejects.parquet", Rejects)
    assert clips["start_s"].to_list() == pytest.approx([0.0, 2.0], abs=2 / FPS)
    (row,) = rejects.filter(pl.col("reason").str.contains("lost tail")).to_dicts()
    assert row["reason"].startswith("damaged: decoding fails after 4.17 s (Invalid data")
    assert (row["start_s"], row["end_s"]) == (pytest.approx(100 / FPS), pytest.approx(6.0))
    assert_covered(tmp_path / "o")
    assert out["clip_s"] + out["rejected_s"] == pytest.approx(6.0, abs=2 / FPS)


def test_damage_mid_stream_is_a_gap_and_what_decodes_after_it_is_curated(tmp_path):
    """Keyframes every second: the decoder skips from the damaged sample to the next keyframe
    and goes on. The skipped seconds are one "damaged" reject, the shot around them is cut
    there (its short piece a "shot" reject), the shots after the damage are clips."""
    src = tmp_path / "damaged.mp4"
    frames, _ = render_frames(SPEC)
    encode_h264(frames, src, fps=FPS, crf=SPEC.crf, preset=SPEC.preset, gop=int(FPS))
    _zero_sample(src, 54)  # in the pan shot (2-4 s), the next keyframe at 3 s
    out = curate(str(src), str(tmp_path / "o"), config=CFG)
    clips = read_clips(str(tmp_path / "o"))
    rejects = read_manifest(tmp_path / "o" / "rejects.parquet", Rejects)
    spans = list(zip(clips["start_s"].to_list(), clips["end_s"].to_list(), strict=True))
    assert spans == [
        (pytest.approx(0.0), pytest.approx(2.0)),
        (pytest.approx(3.0), pytest.approx(4.0)),
        (pytest.approx(4.0), pytest.approx(6.0)),
    ]
    for row in clips.iter_rows(named=True):  # no clip holds the damage
        n = round((row["end_s"] - row["start_s"]) * FPS)
        assert len(decode_frames(row["uri"], width=32)) == row["n_frames"] == n
    (gap,) = rejects.filter(pl.col("reason").str.starts_with("damaged")).to_dicts()
    assert gap["reason"].startswith("damaged: no frame decodes from 2.")
    assert gap["reason"].endswith("to 3.00 s (Invalid data found when processing input)")
    assert 2.0 < gap["start_s"] <= 54 / FPS and gap["end_s"] == pytest.approx(3.0)
    (short,) = rejects.filter(pl.col("reason").str.starts_with("shot ")).to_dicts()
    assert (short["start_s"], short["end_s"]) == (pytest.approx(2.0), gap["start_s"])
    assert_covered(tmp_path / "o")
    assert out["coverage_gaps"] == []
    assert out["clip_s"] + out["rejected_s"] == pytest.approx(6.0, abs=2 / FPS)


def test_decode_gaps_are_reported_and_a_plain_decode_raises(tmp_path):
    src = tmp_path / "damaged.mp4"
    frames, _ = render_frames(SPEC)
    encode_h264(frames, src, fps=FPS, crf=SPEC.crf, preset=SPEC.preset, gop=int(FPS))
    _zero_sample(src, 54)
    for threads in ("AUTO", "NONE"):  # frame threads report the error packets late
        with collect_gaps() as gaps:
            times = [t for t, _ in iter_av_frames(src, start_s=None, end_s=None, threads=threads)]
        (gap,) = gaps
        assert times[gap.frame] == gap.end_s == pytest.approx(3.0)
        assert times[gap.frame - 1] + 1 / FPS == pytest.approx(gap.start_s)
        assert len(times) == 6 * FPS - round((gap.end_s - gap.start_s) * FPS)
    # a clip range after the damage decodes whole, one across it skips the gap
    after = [t for t, _ in iter_av_frames(src, start_s=3.0, end_s=4.0, threads="AUTO")]
    assert after == pytest.approx([3.0 + i / FPS for i in range(int(FPS))])
    assert lost_tail(src, after_s=1.0).startswith("damaged: decoding fails after 1.00 s")
