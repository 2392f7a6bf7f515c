"""Captioned synthetic clips whose captions say what is in them: one object of a named colour and
shape moving in a named direction, "a {colour} {shape} moving {direction}", on a plain or
textured background. Some (colour, shape, direction) combinations are held out of training for
evaluation (:func:`held_out`): a model that follows prompts generalises to them.

:func:`captioned_spec` strings such shots into one video with hard cuts and dissolves (and a
static and a black shot for the curation filters to reject), each shot's caption written to the
JSON sidecar with its time range, so curation gives every clip its own caption.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np

from vfm_core.video.caption_vocabulary import BACKGROUNDS, COLOURS, DIRECTIONS, PALETTE, SHAPES
from vfm_core.video.synthetic import Segment, VideoSpec


@dataclass(kw_only=True, slots=True, frozen=True)
class Subject:
    """What one captioned shot shows."""

    colour: str
    shape: str
    direction: str
    background: str = "plain"

    def caption(self) -> str:
        return f"a {self.colour} {self.shape} moving {self.direction}"

    def as_tuple(self) -> tuple[str, str, str, str]:
        return (self.colour, self.shape, self.direction, self.background)


def all_subjects() -> list[tuple[str, str, str]]:
    """Every (colour, shape, direction) of the vocabulary (40)."""
    return list(itertools.product(COLOURS, SHAPES, DIRECTIONS))


def concept_subjects(colour: str) -> list[tuple[str, str, str]]:
    """Every (colour, shape, direction) of one new colour (:data:`NEW_COLOURS`): a concept for
    fine-tuning; none of them is held out."""
    return list(itertools.product((colour,), SHAPES, DIRECTIONS))


def held_out(colour: str, shape: str, direction: str) -> bool:
    """Combinations kept out of training (1 in 5, every colour, shape and direction still seen
    in training): a fixed rule, so evaluation knows them without a list; a new colour's
    combinations are never held out."""
    if colour not in COLOURS:
        return False
    c, s, d = list(COLOURS).index(colour), SHAPES.index(shape), list(DIRECTIONS).index(direction)
    return (c + 2 * s + 3 * d) % 5 == 0


def parse_caption(text: str) -> tuple[str, str, str] | None:
    """(colour, shape, direction) of a caption of the vocabulary's form, else None."""
    words = text.lower().replace(",", " ").split()
    colour = next((w for w in words if w in PALETTE), None)
    shape = next((w for w in words if w in SHAPES), None)
    direction = next((w for w in words if w in DIRECTIONS), None)
    if colour is None or shape is None or direction is None:
        return None
    return colour, shape, direction


def captioned_spec(
    *,
    width: int = 64,
    height: int = 64,
    fps: float = 12.0,
    seed: int = 0,
    shots: int = 8,
    shot_frames: int = 32,
    train: bool = True,
    concept: str | None = None,
) -> VideoSpec:
    """A video of ``shots`` captioned object shots (training combinations, only held-out ones
    with ``train=False``, or only ``concept``'s, a new colour's), cuts and dissolves between
    them, plus one static and one black shot (no caption) for the filters. Deterministic in
    ``seed``.

    The defaults are what the demo trains on: square 64 x 64 frames (the DiT's 8 x 8 latent grid
    sees the whole frame, so no crop hides the object) and short shots of 32 frames, in which the
    object moves from near the centre to the edge in its direction (1.4 px per frame): the 17
    frames of a 5-latent-frame training window show it move by 1.5 times its own width, from a
    first frame that does not give the direction away."""
    rng = np.random.default_rng(seed)
    pool = [s for s in all_subjects() if held_out(*s) != train]
    if concept is not None:  # shots of one new colour only (fine-tuning data)
        pool = concept_subjects(concept)
    picks = rng.permutation(len(pool))[:shots]
    segs: list[Segment] = []
    for i, k in enumerate(picks):
        subject = Subject(
            colour=pool[k][0],
            shape=pool[k][1],
            direction=pool[k][2],
            background=BACKGROUNDS[int(rng.integers(0, 2))],
        )
        segs.append(
            Segment(
                kind="object",
                n_frames=shot_frames,
                subject=subject.as_tuple(),
                caption=subject.caption(),
                transition="dissolve" if i % 3 == 2 else "cut",
                transition_frames=8,
            )
        )
        if i == shots // 2:  # the curation filters' rejects: a frozen and a black shot
            segs += [
                Segment(kind="static", n_frames=shot_frames),
                Segment(kind="black", n_frames=shot_frames),
            ]
    return VideoSpec(width=width, height=height, fps=fps, seed=seed, segments=tuple(segs))
