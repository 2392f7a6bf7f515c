"""Breaks inside one stream that no clip may cross. A stream that switches its coded picture
size (a screen or call recording, a broadcast capture) is split there: no clip holds two sizes,
each clip has its own part's size, and the analysis decode samples every frame at its own size
(a smaller picture after a larger one used to index past its planes). Recordings joined end to
end (``cat a.ts b.ts``: the timestamps start again) are curated up to the join, the rest is one
reject with its seconds and the way to fix it."""

from __future__ import annotations

from pathlib import Path

import av
import pytest

from tests.curate.conftest import assert_covered
from vfm_core.contracts import Rejects, read_manifest
from vfm_core.curate import CurateConfig, curate
from vfm_core.curate.pipeline import read_clips
from vfm_core.video.io import collect_gaps, decode_frames, iter_sampled_chunks
from vfm_core.video.synthetic import Segment, VideoSpec, make_video

FPS = 25.0


def _part(d: Path, name: str, width: int, height: int, seed: int) -> Path:
    """3 s of one moving shot at width x height, as MPEG-TS (H.264 with in-band headers)."""
    spec = VideoSpec(
        width=width, height=height, fps=FPS, seed=seed, segments=(Segment(n_frames=75),)
    )
    make_video(d / f"{name}.mp4", spec)
    with (
        av.open(str(d / f"{name}.mp4")) as c,
        av.open(str(d / f"{name}.ts"), "w", format="mpegts") as out,
    ):
        st = out.add_stream_from_template(c.streams.video[0])
        for p in c.demux(c.streams.video[0]):
            if p.dts is not None:
                p.stream = st
                out.mux(p)
    return d / f"{name}.ts"


def _joined(dst: Path, parts: list[Path]) -> Path:
    """The parts' packets one after the other in one TS stream, timestamps running on."""
    with av.open(str(dst), "w", format="mpegts") as out:
        st, shift = None, 0
        for part in parts:
            with av.open(str(part)) as c:
                s = c.streams.video[0]
                st = st or out.add_stream_from_template(s)
                step = int(round(1 / FPS / s.time_base))
                last = shift
                for p in c.demux(s):
                    if p.dts is None:
                        continue
                    p.pts, p.dts, p.stream = p.pts + shift, p.dts + shift, st
                    last = max(last, p.pts + step)
                    out.mux(p)
                shift = last
    return dst


@pytest.fixture(scope="module")
def switching(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("sizes")
    big, small = _part(d, "big", 160, 96, 1), _part(d, "small", 96, 64, 2)
    other = _part(d, "other", 96, 64, 3)
    catted = d / "catted.ts"  # three recordings, each with timestamps from 0
    catted.write_bytes(small.read_bytes() + other.read_bytes() + small.read_bytes())
    return {
        "down": _joined(d / "down.ts", [big, small]),
        "up": _joined(d / "up.ts", [small, big]),
        "catted": catted,
    }


@pytest.mark.parametrize("kind", ["down", "up"])
def test_a_size_switch_is_a_boundary_and_each_clip_keeps_its_size(switching, kind, tmp_path):
    src = switching[kind]
    with collect_gaps() as gaps:
        chunks = list(iter_sampled_chunks(src, width=32, chunk=64))
    assert sum(len(ts) for _, ts in chunks) == 150
    (brk,) = gaps
    sizes = ("160x96", "96x64") if kind == "down" else ("96x64", "160x96")
    assert brk.reason == f"picture size changes from {sizes[0]} to {sizes[1]}"
    assert brk.frame == 75 and brk.start_s == brk.end_s == pytest.approx(3.0, abs=0.05)

    out = curate(str(src), str(tmp_path / "o"), config=CurateConfig(min_len_s=1.0))
    clips = read_clips(str(tmp_path / "o"))
    got = [
        (round(a, 1), round(b, 1), f"{w}x{h}")
        for a, b, w, h in clips.select("start_s", "end_s", "width", "height").iter_rows()
    ]
    assert got == [(0.0, 3.0, sizes[0]), (3.0, 6.0, sizes[1])]
    for row in clips.iter_rows(named=True):
        assert len(decode_frames(row["uri"], width=32)) == row["n_frames"] == 75
    assert out["coverage_gaps"] == [] and out["n_rejects"] == 0
    assert_covered(tmp_path / "o")


def test_recordings_joined_end_to_end_are_curated_up_to_the_join(switching, tmp_path):
    dst = tmp_path / "o"
    out = curate(str(switching["catted"]), str(dst), config=CurateConfig(min_len_s=1.0))
    clips = read_clips(str(dst))
    assert clips["start_s"].to_list() == [pytest.approx(0.0)]  # the first recording, once
    assert clips["end_s"].to_list() == [pytest.approx(3.0)]
    (row,) = read_manifest(dst / "rejects.parquet", Rejects).to_dicts()
    assert row["stage"] == "split"
    assert row["reason"].startswith("timestamps start again at 0.00 s after 3.00 s")
    assert "the 6.00 s from there are not curated" in row["reason"]
    assert (row["start_s"], row["end_s"]) == (pytest.approx(3.0), pytest.approx(9.0))
    assert out["clip_s"] + out["rejected_s"] == pytest.approx(9.0, abs=0.1)
    assert_covered(dst)
