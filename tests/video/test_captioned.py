"""The captioned sample set: every shot's caption names its object's colour, shape and direction;
curation cuts the video at its shots and gives every clip its shot's caption; held-out
combinations never appear in the training sample; the rendered object really has the caption's
colour and moves the caption's way."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import polars as pl

from vfm_core.curate import curate
from vfm_core.video.caption_vocabulary import COLOURS, DIRECTIONS
from vfm_core.video.captioned import all_subjects, captioned_spec, held_out, parse_caption
from vfm_core.video.sample_set import write_sample_videos
from vfm_core.video.synthetic import render_frames


def test_vocabulary_and_held_out_split():
    subjects = all_subjects()
    assert len(subjects) == 40
    out = [s for s in subjects if held_out(*s)]
    assert len(out) == 8
    for i, words in enumerate((COLOURS, ("circle", "square"), DIRECTIONS)):  # all seen in train
        assert {s[i] for s in subjects if not held_out(*s)} == set(words)
    assert parse_caption("a red circle moving right") == ("red", "circle", "right")
    assert parse_caption("moving shapes") is None


def _centre(frame: np.ndarray, colour: str, caption: str) -> tuple[float, float]:
    """(x, y) centroid of the pixels of `colour` in `frame` (H, W, 3); there must be an object."""
    target = np.array(COLOURS[colour], dtype=np.float32)
    mask = np.abs(frame.astype(np.float32) - target).sum(-1) < 30  # (H, W)
    assert mask.sum() > 50, caption  # the caption's colour
    ys, xs = np.nonzero(mask)
    return xs.mean(), ys.mean()


def test_rendered_object_has_the_caption_colour_and_direction():
    """The object has the caption's colour, moves the caption's way, and starts near the centre
    for every direction (its first frame does not give the direction away)."""
    spec = captioned_spec(seed=3, shots=8)
    frames, gt = render_frames(spec)
    frames = list(frames)
    h, w = frames[0].shape[:2]
    starts = 0
    for seg, (a, b) in zip(spec.segments, gt.segments):
        if seg.kind != "object":
            continue
        colour, shape, direction, _ = seg.subject
        _centre(frames[a + 10], colour, seg.caption)  # past a dissolve into the shot
        if seg.transition != "cut":  # frames[a] blends in the last shot
            continue
        starts += 1
        first = _centre(frames[a], colour, seg.caption)
        last = _centre(frames[b - 1], colour, seg.caption)
        assert abs(first[0] - w / 2) <= 0.1 * w + 1, seg.caption  # near the centre
        assert abs(first[1] - h / 2) <= 0.1 * h + 1, seg.caption
        dx, dy = DIRECTIONS[direction]
        move = np.subtract(last, first)  # first -> last frame of the shot
        assert move[0] * dx + move[1] * dy > 15, (seg.caption, move)
        assert abs(move[0] * dy) + abs(move[1] * dx) < 1, (seg.caption, move)  # along its axis
    assert starts >= 4


def test_sample_curates_to_one_captioned_clip_per_shot(tmp_path):
    (path,) = write_sample_videos(tmp_path / "raw", n=1)
    doc = json.loads(path.with_suffix(".json").read_text())
    captions = [s["caption"] for s in doc["segments"]]
    assert len(captions) == 8 and all(not held_out(*parse_caption(c)) for c in captions)
    curate(str(tmp_path / "raw"), str(tmp_path / "out"))
    clips = pl.read_parquet(tmp_path / "out" / "clips.parquet")
    assert sorted(clips["caption"].to_list()) == sorted(captions)
    rejects = pl.read_parquet(tmp_path / "out" / "rejects.parquet")
    assert any("static" in r for r in rejects["reason"].to_list())


def test_vfm_sample_writes_training_or_held_out_sets(tmp_path, capsys):
    from vfm_core.cli import main

    assert main(["sample", str(tmp_path / "ev"), "--videos", "1", "--held-out", "--json"]) == 0
    (video,) = json.loads(capsys.readouterr().out)["videos"]
    doc = json.loads(Path(video).with_suffix(".json").read_text())
    captions = [s["caption"] for s in doc["segments"] if s.get("caption")]
    assert len(captions) == 8 and all(held_out(*parse_caption(c)) for c in captions)
    (tmp_path / "file").write_text("x")
    assert main(["sample", str(tmp_path / "file")]) == 2
    assert "is not a folder" in capsys.readouterr().err
    # the same folder for the training set: rewritten (it kept the held-out videos and said
    # it wrote training ones); the same request again keeps the file; an empty video is rewritten
    assert main(["sample", str(tmp_path / "ev"), "--videos", "1"]) == 0
    doc = json.loads(Path(video).with_suffix(".json").read_text())
    captions = [s["caption"] for s in doc["segments"] if s.get("caption")]
    assert not any(held_out(*parse_caption(c)) for c in captions)
    written = Path(video).stat().st_mtime_ns
    assert main(["sample", str(tmp_path / "ev"), "--videos", "1"]) == 0
    assert Path(video).stat().st_mtime_ns == written
    Path(video).write_bytes(b"")
    assert main(["sample", str(tmp_path / "ev"), "--videos", "1"]) == 0
    assert Path(video).stat().st_size > 1000
    # a folder name with a colon (FFmpeg read "ab:cd" as a protocol); a URL
    assert main(["sample", str(tmp_path / "ab:cd"), "--videos", "1"]) == 0
    assert (tmp_path / "ab:cd" / "sample_00.mp4").stat().st_size > 1000
    capsys.readouterr()
    assert main(["sample", "s3://bucket/x"]) == 2
    assert "written to a local folder" in capsys.readouterr().err


def test_a_concept_sample_shows_only_its_new_colour_and_is_read_back(tmp_path, capsys):
    """``vfm sample --concept magenta``: every shot of a colour the built-in sample never shows
    (none held out), which prompt following reads back with its direction; a known colour or an
    unknown name is one line."""
    from vfm_core.cli import main
    from vfm_core.infer.prompt_follow import read_video
    from vfm_core.video.caption_vocabulary import NEW_COLOURS
    from vfm_core.video.io import decode_frames

    assert not set(NEW_COLOURS) & set(COLOURS)
    assert main(["sample", str(tmp_path / "c"), "--videos", "1", "--concept", "magenta"]) == 0
    assert "new-concept (magenta)" in capsys.readouterr().out
    doc = json.loads((tmp_path / "c" / "sample_00.json").read_text())
    subjects = [parse_caption(s["caption"]) for s in doc["segments"]]
    assert len(subjects) == 8 and {s[0] for s in subjects} == {"magenta"}
    assert not any(held_out(*s) for s in subjects)
    frames = decode_frames(tmp_path / "c" / "sample_00.mp4")
    assert doc["segments"][0]["start_s"] == 0.0  # the first shot: frames 0..31
    reading = read_video(frames[2:30])
    assert (reading.colour, reading.direction) == (subjects[0][0], subjects[0][2])
    for bad in ("red", "teal"):
        assert main(["sample", str(tmp_path / bad), "--concept", bad]) == 2
        assert "expected a new colour, one of magenta, cyan" in capsys.readouterr().err
