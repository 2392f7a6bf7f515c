import json
import os
import re

import numpy as np
import pytest

from vfm_core.annotate.caption import (
    Caption,
    Captioner,
    ChainCaptioner,
    CurateCaptioner,
    Segment,
    SidecarCaptioner,
    SidecarError,
    VLMCaptioner,
    segment_caption,
)

FRAMES = np.random.default_rng(0).integers(0, 255, (6, 36, 64, 3), dtype=np.uint8)


def _cap(c: Captioner, uri: str, a: float = 0.0, b: float = 2.0) -> Caption | None:
    return c.caption(source_uri=uri, start_s=a, end_s=b, frames=FRAMES)


def test_sidecar_txt_and_json(tmp_path):
    (tmp_path / "a.txt").write_text("  a red circle\n")
    (tmp_path / "b.json").write_text(
        json.dumps(
            {
                "caption": "whole video",
                "segments": [
                    {"start_s": 0, "end_s": 5, "caption": "first shot"},
                    {"start_s": 5, "end_s": 9, "caption": "second shot"},
                ],
            }
        )
    )
    (tmp_path / "c.json").write_text("[1, 2]")
    (tmp_path / "d.json").write_text("{not json")
    s = SidecarCaptioner()
    assert isinstance(s, Captioner)
    assert _cap(s, str(tmp_path / "a.mp4")) == Caption(text="a red circle", source="sidecar")
    assert _cap(s, str(tmp_path / "b.mp4"), 4.0, 8.0).text == "second shot"
    assert _cap(s, str(tmp_path / "b.mp4"), 20.0, 22.0).text == "whole video"
    assert _cap(s, str(tmp_path / "none.mp4")) is None
    with pytest.raises(ValueError, match=r"c\.json: expected a JSON object"):
        _cap(s, str(tmp_path / "c.mp4"))
    with pytest.raises(ValueError, match=r"d\.json: invalid JSON"):
        _cap(s, str(tmp_path / "d.mp4"))


def test_vlm_captioner_tiny_random_model(tiny_vlm, tmp_path):
    vlm = VLMCaptioner(tiny_vlm, max_new_tokens=6)
    vlm.setup()
    a = _cap(vlm, "x.mp4")
    b = _cap(vlm, "x.mp4")
    assert a is not None and a.source == "vlm" and a.text
    assert a == b  # greedy decoding is deterministic
    # every generated word comes from the tiny vocabulary
    from tests.annotate.conftest import WORDS

    assert set(a.text.split()) <= set(WORDS) | {"[UNK]"}
    (tmp_path / "v.txt").write_text("from the sidecar")
    chain = ChainCaptioner(SidecarCaptioner(), vlm)
    assert _cap(chain, str(tmp_path / "v.mp4")).source == "sidecar"
    assert _cap(chain, str(tmp_path / "w.mp4")).source == "vlm"


def test_vlm_missing_dir(tmp_path):
    with pytest.raises(FileNotFoundError, match="VLMCaptioner: model directory"):
        VLMCaptioner(tmp_path / "nope")


def test_segment_caption_needs_the_majority_of_the_clip():
    segs = [
        Segment(start_s=0.0, end_s=5.0, caption="first shot"),
        Segment(start_s=5.0, end_s=9.0, caption="second shot"),
    ]
    assert segment_caption(segs, 0.0, 4.0) == "first shot"
    # a clip 4.84-8.0 overlaps the first segment by 0.16 s: the second one (> 50 %) wins
    assert segment_caption(segs, 4.84, 8.0) == "second shot"
    # exactly half is not a majority; just over half is
    assert segment_caption(segs, 3.0, 7.0) is None
    assert segment_caption(segs, 2.99, 7.0) == "first shot"
    # a short overlap never captions a clip that is mostly outside every segment
    assert segment_caption(segs, 8.84, 20.0) is None
    assert segment_caption([Segment(start_s=0, end_s=9, caption="")], 0.0, 4.0) is None


def test_sidecar_provenance_and_small_overlap_keeps_the_video_caption(tmp_path):
    (tmp_path / "v.json").write_text(
        json.dumps(
            {
                "caption": "whole video",
                "segments": [{"start_s": 0.0, "end_s": 2.16, "caption": "first shot"}],
            }
        )
    )
    s, uri = SidecarCaptioner(), str(tmp_path / "v.mp4")
    assert _cap(s, uri, 0.0, 2.0) == Caption(text="first shot", source="segment")
    # 0.16 s of a 4 s clip in the segment: the video's caption, not the segment's
    assert _cap(s, uri, 2.0, 6.0) == Caption(text="whole video", source="sidecar")
    (tmp_path / "w.json").write_text(json.dumps({"segments": [{"start_s": 0, "end_s": 1}]}))
    assert _cap(s, str(tmp_path / "w.mp4"), 0.0, 1.0) is None  # no caption at all
    (tmp_path / "bom.txt").write_bytes("\ufeffcafé au lait\n".encode())
    assert _cap(s, str(tmp_path / "bom.mp4")).text == "café au lait"  # a UTF-8 BOM is fine


@pytest.mark.parametrize(
    ("name", "data", "reason"),
    [
        ("latin1.txt", "café".encode("latin-1"), r"not UTF-8 text \(byte 0xe9 at offset 3\)"),
        ("utf16.json", '{"caption": "x"}'.encode("utf-16"), r"not UTF-8 text \(byte 0xff at"),
        ("broken.json", b'{"caption": "x"', r"invalid JSON"),
        ("list.json", b"[1, 2]", r"expected a JSON object, got list"),
        ("num.json", b'{"caption": 3}', r'"caption" must be a string'),
        ("seg.json", b'{"segments": [{"start_s": "0", "end_s": 1}]}', r"segments\[0\] needs"),
        (
            "order.json",
            b'{"segments": [{"start_s": 2, "end_s": 1}]}',
            r"segments\[0\]: end_s 1 must be after",
        ),
    ],
)
def test_unusable_sidecar_names_the_file(tmp_path, name, data, reason):
    (tmp_path / name).write_bytes(data)
    video = str(tmp_path / name).rsplit(".", 1)[0] + ".mp4"
    with pytest.raises(SidecarError, match=rf"sidecar caption .*{name}: {reason}"):
        _cap(SidecarCaptioner(), video)
    # curation passes it over: no caption, the reason kept
    cap = _cap(CurateCaptioner(), video)
    assert cap.source == "none" and cap.text == "" and name in cap.problem
    assert re.search(rf"{name}: {reason}", cap.problem)


@pytest.mark.parametrize("kind", ["fifo", "dir"])
def test_a_sidecar_that_is_no_file_is_unusable_unopened(tmp_path, kind):
    """A FIFO ``x.txt`` (opening it would block the run forever) or a directory ``x.json``:
    an unusable sidecar naming what it is, the clip kept without its caption."""
    path = tmp_path / ("x.txt" if kind == "fifo" else "x.json")
    os.mkfifo(path) if kind == "fifo" else path.mkdir()
    what = "named pipe" if kind == "fifo" else "a directory"
    with pytest.raises(SidecarError, match=rf"{path.name}: cannot be read: .*{what}"):
        _cap(SidecarCaptioner(), str(tmp_path / "x.mp4"))
    cap = _cap(CurateCaptioner(), str(tmp_path / "x.mp4"))
    assert cap.source == "none" and what in cap.problem


def test_curate_captioner_always_returns_a_caption(tmp_path):
    (tmp_path / "a.txt").write_text("a red circle")
    c = CurateCaptioner()
    assert not c.needs_frames
    assert _cap(c, str(tmp_path / "a.mp4")) == Caption(text="a red circle", source="sidecar")
    assert _cap(c, str(tmp_path / "b.mp4")) == Caption(text="", source="none")


def test_curate_captioner_falls_back_to_the_vlm(tiny_vlm, tmp_path):
    (tmp_path / "bad.txt").write_bytes(b"\xff\xfe")
    c = CurateCaptioner(tiny_vlm)
    c.setup()
    assert c.needs_frames
    cap = _cap(c, str(tmp_path / "bad.mp4"))
    assert cap.source == "vlm" and cap.text and "bad.txt: not UTF-8" in cap.problem
