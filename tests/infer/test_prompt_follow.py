"""Prompt following read from pixels: every rendered captioned shot (plain or textured
background) reads back as its caption's colour and direction; a video without an object or
without motion says so; accuracy is counted overall and for held-out combinations."""

from __future__ import annotations

import numpy as np
import pytest

from vfm_core.infer.prompt_follow import (
    PromptScore,
    Reading,
    continuation_kept,
    read_video,
    score_frames,
    vocabulary_prompts,
)
from vfm_core.video.captioned import all_subjects, held_out
from vfm_core.video.synthetic import Segment, VideoSpec, render_frames


def _shot(colour, shape, direction, background, seed=0):
    seg = Segment(kind="object", n_frames=24, subject=(colour, shape, direction, background))
    frames, _ = render_frames(VideoSpec(width=64, height=64, seed=seed, segments=(seg,)))
    return np.stack(list(frames))


@pytest.mark.parametrize("background", ["plain", "textured"])
def test_every_rendered_combination_reads_back(background):
    score = PromptScore()
    for i, (colour, shape, direction) in enumerate(all_subjects()):
        r = read_video(_shot(colour, shape, direction, background, seed=i))
        score.add(f"a {colour} {shape} moving {direction}", r)
    m = score.metrics()
    assert m["colour_acc"] == 1.0 and m["direction_acc"] == 1.0, m
    assert score.n_held_out == sum(held_out(*s) for s in all_subjects())


def test_no_object_and_no_motion():
    dark = np.full((6, 32, 32, 3), 30, np.uint8)
    assert read_video(dark) == Reading(colour=None, direction=None, pixels=0, shift=(0.0, 0.0))
    still = dark.copy()
    still[:, 10:16, 10:16] = (220, 40, 40)
    r = read_video(still)
    assert r.colour == "red" and r.direction is None


def test_wrong_reading_counts_and_bad_prompt():
    score = PromptScore()
    score.add(
        "a red circle moving right",
        Reading(colour="red", direction="left", pixels=9, shift=(5.0, 0.0)),
    )
    assert score.metrics() == {"colour_acc": 1.0, "direction_acc": 0.0}
    with pytest.raises(ValueError, match="form"):
        score.add("moving shapes", Reading(colour=None, direction=None, pixels=0, shift=(0, 0)))


def test_vocabulary_prompts_cover_the_vocabulary_and_score_rendered_clips():
    every = vocabulary_prompts()
    assert len(every) == len(set(every)) == 40
    some = vocabulary_prompts(8)
    assert len(some) == 8 and set(some) <= set(every)
    assert {p.split()[1] for p in some} == {"red", "green", "blue", "yellow", "white"}
    with pytest.raises(ValueError, match="n must be"):
        vocabulary_prompts(0)
    clips = [_shot(*p.split()[1:3], p.split()[-1], "textured", seed=i) for i, p in enumerate(some)]
    m = score_frames(clips, some)
    assert m["colour_acc"] == m["direction_acc"] == 1.0 and m["n_scored"] == 8
    clips[0] = clips[0][::-1]  # played backwards: the direction is wrong, the colour still right
    m = score_frames(clips, some)
    assert m["colour_acc"] == 1.0 and m["direction_acc"] == 7 / 8


def test_continuations_read_back_against_the_given_clip():
    given = [_shot("red", "circle", "right", "plain"), _shot("blue", "square", "up", "textured")]
    same = [
        _shot("red", "square", "right", "textured", seed=3),
        _shot("blue", "circle", "up", "plain"),
    ]
    assert continuation_kept(given, same) == {"colour_kept": 1.0, "motion_kept": 1.0, "n_scored": 2}
    other = [_shot("green", "circle", "right", "plain"), _shot("blue", "square", "left", "plain")]
    assert continuation_kept(given, other) == {
        "colour_kept": 0.5,
        "motion_kept": 0.5,
        "n_scored": 2,
    }
    # a given clip without a readable object or motion is not scored
    dark = np.full((24, 64, 64, 3), 30, np.uint8)
    got = continuation_kept([dark, given[0]], [given[0], given[0]])
    assert got == {"colour_kept": 1.0, "motion_kept": 1.0, "n_scored": 1}
    with pytest.raises(ValueError, match="2 given clips but 1 made"):
        continuation_kept(given, same[:1])
