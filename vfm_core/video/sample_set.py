"""The built-in sample: synthetic videos of captioned shots, "a {colour} {shape} moving
{direction}" (:mod:`vfm_core.video.captioned`), joined by hard cuts and dissolves, with a static
and a black shot for the filters; captions per shot in a JSON sidecar. The input of ``make demo``
and of the pipeline tests. Held-out (colour, shape, direction) combinations never appear in it."""

from __future__ import annotations

from pathlib import Path

from vfm_core.video.captioned import captioned_spec
from vfm_core.video.synthetic import make_video

SAMPLE_MIN_LEN_S = 1.0
"""Shortest clip to curate the sample with: its shots are 32 frames (2.7 s at 12 fps) less the
frames of a dissolve, below the curation default of 2 s once a dissolve takes its share."""
SAMPLE_MAX_LEN_S = 6.0
"""Longest clip for the sample (short training clips)."""


def write_sample_videos(
    dst: str | Path,
    *,
    n: int = 3,
    width: int = 64,
    height: int = 64,
    seed: int = 0,
    train: bool = True,
) -> list[Path]:
    """Write ``n`` ~27 s synthetic videos ``sample_XX.mp4`` (+ ``.json`` per-shot captions) under
    ``dst`` of training combinations (``train=False``: only the held-out ones); videos already
    there are kept (so a rerun does not change the input)."""
    if n < 1:
        raise ValueError(f"sample: n must be >= 1, got {n}")
    out = Path(dst)
    if out.exists() and not out.is_dir():
        raise ValueError(f"sample: {out} exists and is not a folder")
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for i in range(n):
        path = out / f"sample_{i:02d}.mp4"
        if not (path.exists() and path.with_suffix(".json").exists()):
            make_video(path, captioned_spec(width=width, height=height, seed=seed + i, train=train))
        paths.append(path)
    return paths
