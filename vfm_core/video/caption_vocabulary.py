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
SHAPES = ("circle", "square")
DIRECTIONS: dict[str, tuple[int, int]] = {  # (dx, dy) in image coordinates (y down)
    "left": (-1, 0),
    "right": (1, 0),
    "up": (0, -1),
    "down": (0, 1),
}
BACKGROUNDS = ("plain", "textured")
