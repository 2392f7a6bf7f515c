"""The built-in sample: synthetic videos of captioned shots, "a {colour} {shape} moving
{direction}" (:mod:`vfm_core.video.captioned`), joined by hard cuts and dissolves, with a static
and a black shot for the filters; captions per shot in a JSON sidecar. The input of ``make demo``
and of the pipeline tests. Held-out (colour, shape, direction) combinations never appear in it."""

from __future__ import annotations

import json
from pathlib import Path

from vfm_core.video.caption_vocabulary import NEW_COLOURS
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
    concept: str | None = None,
) -> list[Path]:
    """Write ``n`` ~27 s synthetic videos ``sample_XX.mp4`` (+ ``.json`` per-shot captions) under
    ``dst`` of training combinations (``train=False``: only the held-out ones; ``concept``: only
    shots of that new colour, :data:`NEW_COLOURS`); a video already
    there with the same captions is kept (a rerun does not change the input); one of another
    seed or kind, or an empty one, is written again."""
    if n < 1:
        raise ValueError(f"sample: n must be >= 1, got {n}")
    if concept is not None and concept not in NEW_COLOURS:
        raise ValueError(
            f"sample: --concept {concept!r}: expected a new colour, one of {', '.join(NEW_COLOURS)}"
        )
    if not str(dst).strip():
        raise ValueError("sample: the folder is empty: name one")
    if "://" in str(dst):
        raise ValueError(f"sample: {dst}: the samples are written to a local folder")
    out = Path(dst).resolve()  # absolute: FFmpeg reads "ab:cd/x.mp4" as protocol "ab"
    if out.exists() and not out.is_dir():
        raise ValueError(f"sample: {dst} exists and is not a folder")
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for i in range(n):
        path = out / f"sample_{i:02d}.mp4"
        spec = captioned_spec(
            width=width, height=height, seed=seed + i, train=train, concept=concept
        )
        if not _written(path, spec):
            make_video(path, spec)
        paths.append(path)
    return paths


def _written(path: Path, spec) -> bool:
    """Whether ``path`` already holds the sample of ``spec``: a non-empty video whose sidecar
    has the spec's captions (a rerun keeps it; another seed or ``train`` rewrites it)."""
    sidecar = path.with_suffix(".json")
    if not path.is_file() or not path.stat().st_size or not sidecar.is_file():
        return False
    try:
        doc = json.loads(sidecar.read_text())
        captions = [row["caption"] for row in doc["segments"]]
    except (OSError, ValueError, KeyError, TypeError):
        return False
    wanted = [seg.caption for seg in spec.segments if seg.caption]  # as make_video writes them
    return captions == wanted and doc.get("caption", "") == (spec.caption or "")
