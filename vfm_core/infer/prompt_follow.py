"""Prompt following without a learned model: read a generated video, find the moving object of a
vocabulary colour (:mod:`vfm_core.video.caption_vocabulary`) and measure its colour and direction,
then compare with the prompt "a {colour} {shape} moving {direction}".

Per frame, a pixel votes for the vocabulary colour it is nearest to when it is within
``max_dist`` (RGB Euclidean) of it and bright/saturated enough to be an object, not the dark
background; the video's colour is the one with most votes over all frames. Its direction is the
sign of the larger component of the displacement of that colour's centroid from the first third
of the frames to the last third (image y points down: "up" is negative dy).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from vfm_core.video.caption_vocabulary import DIRECTIONS, PALETTE
from vfm_core.video.captioned import all_subjects, held_out, parse_caption


@dataclass(kw_only=True, slots=True, frozen=True)
class Reading:
    """What a video shows, as measured."""

    colour: str | None
    """Vocabulary colour with most object pixels (None: no object found)."""
    direction: str | None
    """left | right | up | down of the object's centroid (None: it did not move)."""
    pixels: int
    """Object pixels counted for the colour (all frames)."""
    shift: tuple[float, float]
    """Centroid displacement (dx, dy) in pixels, first third -> last third of the frames."""


def read_video(frames: np.ndarray, *, max_dist: float = 90.0, min_shift: float = 1.0) -> Reading:
    """Measure the object of ``frames`` (T, H, W, 3) uint8."""
    if frames.ndim != 4 or frames.shape[-1] != 3 or len(frames) == 0:
        raise ValueError(f"read_video: expected (T, H, W, 3) frames, got {frames.shape}")
    names = list(PALETTE)  # the sample's colours and the fine-tuning concepts'
    palette = np.array([PALETTE[n] for n in names], dtype=np.float32)  # (K, 3)
    f = frames.astype(np.float32)  # (T, H, W, 3)
    dist = np.linalg.norm(f[..., None, :] - palette, axis=-1)  # (T, H, W, K)
    nearest = dist.argmin(-1)  # (T, H, W)
    close = dist.min(-1) < max_dist
    bright = f.max(-1) > 120  # objects are bright or saturated; backgrounds are dark
    votes = [(close & bright & (nearest == k)) for k in range(len(names))]
    counts = [int(v.sum()) for v in votes]
    k = int(np.argmax(counts))
    if counts[k] == 0:
        return Reading(colour=None, direction=None, pixels=0, shift=(0.0, 0.0))
    mask = votes[k]  # (T, H, W)
    t = len(frames)
    third = max(1, t // 3)

    def centroid(m: np.ndarray) -> np.ndarray | None:
        ys, xs = np.nonzero(m)  # (H, W) mask of one frame
        if len(xs) == 0:
            return None
        return np.array([xs.mean(), ys.mean()])

    first = [c for c in (centroid(m) for m in mask[:third]) if c is not None]
    last = [c for c in (centroid(m) for m in mask[t - third :]) if c is not None]
    if not first or not last:
        return Reading(colour=names[k], direction=None, pixels=counts[k], shift=(0.0, 0.0))
    dx, dy = np.mean(last, 0) - np.mean(first, 0)
    direction = None
    if max(abs(dx), abs(dy)) >= min_shift:
        step = (int(np.sign(dx)), 0) if abs(dx) >= abs(dy) else (0, int(np.sign(dy)))
        direction = next(d for d, v in DIRECTIONS.items() if v == step)
    return Reading(
        colour=names[k], direction=direction, pixels=counts[k], shift=(float(dx), float(dy))
    )


@dataclass(kw_only=True, slots=True)
class PromptScore:
    """Accuracy of a set of generated videos against their prompts."""

    n: int = 0
    colour_ok: int = 0
    direction_ok: int = 0
    n_held_out: int = 0
    colour_ok_held_out: int = 0
    direction_ok_held_out: int = 0

    def add(self, prompt: str, reading: Reading) -> None:
        want = parse_caption(prompt)
        if want is None:
            raise ValueError(f"prompt {prompt!r} is not of the form 'a COLOUR SHAPE moving DIR'")
        c_ok, d_ok = reading.colour == want[0], reading.direction == want[2]
        self.n += 1
        self.colour_ok += c_ok
        self.direction_ok += d_ok
        if held_out(*want):
            self.n_held_out += 1
            self.colour_ok_held_out += c_ok
            self.direction_ok_held_out += d_ok

    def metrics(self) -> dict[str, float]:
        """colour_acc, direction_acc (and the held-out ones when there were held-out prompts)."""
        out = {
            "colour_acc": self.colour_ok / max(1, self.n),
            "direction_acc": self.direction_ok / max(1, self.n),
        }
        if self.n_held_out:
            out["colour_acc_held_out"] = self.colour_ok_held_out / self.n_held_out
            out["direction_acc_held_out"] = self.direction_ok_held_out / self.n_held_out
        return out


def score_videos(videos: list[str], prompts: list[str]) -> dict[str, float] | None:
    """Prompt following of generated videos (MP4 paths) against their prompts: the
    :meth:`PromptScore.metrics` over the prompts of the vocabulary form, plus ``n_scored``; None
    when no prompt is of that form (free text cannot be read back from pixels)."""
    from vfm_core.video.io import decode_frames

    if len(videos) != len(prompts):
        raise ValueError(f"score_videos: {len(videos)} videos but {len(prompts)} prompts")
    score = PromptScore()
    for video, prompt in zip(videos, prompts, strict=True):
        if parse_caption(prompt) is not None:
            score.add(prompt, read_video(decode_frames(video)))
    if score.n == 0:
        return None
    return {**score.metrics(), "n_scored": float(score.n)}


def vocabulary_prompts(n: int | None = None) -> list[str]:
    """Captions of the vocabulary, "a {colour} {shape} moving {direction}": all 40 (the held-out
    combinations included) in a fixed order, or ``n`` of them spread evenly over that order."""
    every = [f"a {c} {s} moving {d}" for c, s, d in all_subjects()]
    if n is None or n >= len(every):
        return every
    if n < 1:
        raise ValueError(f"vocabulary_prompts: n must be >= 1, got {n}")
    return [every[i * len(every) // n] for i in range(n)]


def score_frames(clips: list[np.ndarray], prompts: list[str]) -> dict[str, float]:
    """:meth:`PromptScore.metrics` (+ ``n_scored``) of decoded clips, each (T, H, W, 3) uint8,
    against their vocabulary prompts."""
    if len(clips) != len(prompts):
        raise ValueError(f"score_frames: {len(clips)} clips but {len(prompts)} prompts")
    score = PromptScore()
    for frames, prompt in zip(clips, prompts, strict=True):
        score.add(prompt, read_video(frames))
    return {**score.metrics(), "n_scored": float(score.n)}


def continuation_kept(given: list[np.ndarray], made: list[np.ndarray]) -> dict[str, float]:
    """Continuations ``made`` of clips ``given`` (each (T, H, W, 3) uint8) read back like prompts,
    against what each given clip shows: ``colour_kept`` (the same object colour), ``motion_kept``
    (the same direction), over the given clips whose object and motion were read (``n_scored``)."""
    if len(given) != len(made):
        raise ValueError(f"continuation_kept: {len(given)} given clips but {len(made)} made")
    pairs = [(read_video(g), read_video(m)) for g, m in zip(given, made, strict=True)]
    pairs = [(g, m) for g, m in pairs if g.colour and g.direction]
    n = max(1, len(pairs))
    return {
        "colour_kept": sum(g.colour == m.colour for g, m in pairs) / n,
        "motion_kept": sum(g.direction == m.direction for g, m in pairs) / n,
        "n_scored": float(len(pairs)),
    }
