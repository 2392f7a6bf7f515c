"""The caption vocabulary of the captioned synthetic clips: object colours (RGB), shapes, motion
directions and backgrounds. `video.synthetic` renders an "object" segment from these words,
`video.captioned` writes captions and picks subjects from them, `infer.prompt_follow` reads them
back from generated videos.
"""

from __future__ import annotations

COLOURS: dict[str, tuple[int, int, int]] = {
    "red": (220, 40, 40),
    "green": (40, 200, 60),
    "blue": (40, 80, 235),
    "yellow": (235, 220, 40),
    "white": (245, 245, 245),
}
NEW_COLOURS: dict[str, tuple[int, int, int]] = {
    "magenta": (230, 40, 230),
    "cyan": (40, 225, 230),
}
"""Colours the built-in sample never shows: a concept a trained model has not seen, for
fine-tuning (``vfm sample --concept magenta``); far from every colour of :data:`COLOURS`."""
PALETTE: dict[str, tuple[int, int, int]] = {**COLOURS, **NEW_COLOURS}
"""Every colour the renderer draws and prompt following reads back."""
SHAPES = ("circle", "square")
DIRECTIONS: dict[str, tuple[int, int]] = {  # (dx, dy) in image coordinates (y down)
    "left": (-1, 0),
    "right": (1, 0),
    "up": (0, -1),
    "down": (0, 1),
}
BACKGROUNDS = ("plain", "textured")
