"""Contact sheet: generated (or curated) videos as one PNG a person can glance at — one row per
video, ``columns`` frames evenly spread over it, the video's caption / prompt above its row.

Used for the MLflow run of a generation and the pipeline report.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from vfm_core.video.io import VideoError, decode_frames

_LABEL_H = 14  # pixels of caption strip above each row
_PAD = 2


def pick_frames(frames: np.ndarray, columns: int) -> np.ndarray:
    """``columns`` frames evenly spread from first to last: (T, H, W, 3) -> (columns, H, W, 3)
    (fewer when the video is shorter)."""
    t = frames.shape[0]
    idx = np.unique(np.linspace(0, t - 1, num=min(columns, t)).round().astype(int))
    return frames[idx]


def contact_sheet(
    videos: list[str | Path | np.ndarray],
    labels: list[str],
    out: str | Path,
    *,
    columns: int = 6,
    scale: int = 2,
) -> Path:
    """Write a PNG with one labelled row of ``columns`` frames per video (a path, or decoded
    frames (T, H, W, 3) uint8; each frame up-scaled ``scale`` x, nearest neighbour, so 64 x 64
    generations stay visible); returns its path. Raises :class:`VideoError` naming a video that
    cannot be decoded."""
    from PIL import Image, ImageDraw

    if len(videos) != len(labels):
        raise ValueError(f"contact_sheet: {len(videos)} videos but {len(labels)} labels")
    if not videos:
        raise ValueError("contact_sheet: no videos")
    rows = []
    for v in videos:
        frames = v if isinstance(v, np.ndarray) else decode_frames(str(v))  # (T, H, W, 3)
        frames = pick_frames(frames, columns)  # (C, H, W, 3)
        frames = frames.repeat(scale, axis=1).repeat(scale, axis=2)
        rows.append(frames)
    h = max(r.shape[1] for r in rows)
    w = max(r.shape[2] for r in rows)
    width = columns * (w + _PAD) + _PAD
    height = len(rows) * (h + _LABEL_H + _PAD) + _PAD
    sheet = Image.new("RGB", (width, height), (24, 24, 24))
    draw = ImageDraw.Draw(sheet)
    for r, (frames, label) in enumerate(zip(rows, labels, strict=True)):
        top = _PAD + r * (h + _LABEL_H + _PAD)
        draw.text((_PAD + 1, top + 1), label[: width // 6], fill=(230, 230, 230))
        for c, frame in enumerate(frames):
            sheet.paste(Image.fromarray(frame), (_PAD + c * (w + _PAD), top + _LABEL_H))
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    sheet.save(out)
    return out


__all__ = ["VideoError", "contact_sheet", "pick_frames"]
