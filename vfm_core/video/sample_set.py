"""The built-in sample: a few synthetic videos (cuts, dissolves, static and black segments, moving
shapes) with sidecar captions — the input of ``make demo`` and of the pipeline tests."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from vfm_core.video.synthetic import demo_spec, make_video

CAPTIONS = (
    "moving shapes over coloured textures",
    "bright shapes bouncing across a striped background",
    "a slow pan over coloured patterns with drifting discs",
    "squares and circles sliding over a soft gradient",
)


def write_sample_videos(
    dst: str | Path, *, n: int = 3, width: int = 128, height: int = 72, seed: int = 0
) -> list[Path]:
    """Write ``n`` ~17 s synthetic videos ``sample_XX.mp4`` (+ ``.txt`` captions) under ``dst``;
    videos already there are kept (so a rerun does not change the input)."""
    if n < 1:
        raise ValueError(f"sample: n must be >= 1, got {n}")
    out = Path(dst)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for i in range(n):
        path = out / f"sample_{i:02d}.mp4"
        if not (path.exists() and path.with_suffix(".txt").exists()):
            spec = demo_spec(width=width, height=height, seed=seed + i)
            make_video(path, dataclasses.replace(spec, caption=CAPTIONS[i % len(CAPTIONS)]))
        paths.append(path)
    return paths
