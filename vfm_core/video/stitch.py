"""Stitching: merge adjacent spans whose boundary frames look alike (undo false cuts).

After splitting, the last `n_boundary` frames of span i and the first `n_boundary` frames of span
i + 1 are embedded; if the cosine similarity of their mean embeddings is at least `threshold` the
two spans are one shot and are merged (the paper's stitching stage). Only touching spans merge (a
gap = a dropped fade or black run is a real transition), and never beyond `max_frames`, so the
windows a max-length rule made are not glued back together.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from vfm_core.video.io import Source, decode_frames
from vfm_core.video.shots import Span, hsv_histograms

Embedder = Callable[[np.ndarray], np.ndarray]
"""RGB uint8 frames (N, H, W, 3) -> embeddings (N, D)."""


def color_thumb_embed(frames: np.ndarray) -> np.ndarray:
    """Fast built-in embedder: HSV histogram + 8x8 RGB thumbnail, L2-normalised -> (N, D)."""
    n, h, w, _ = frames.shape
    hist = np.sqrt(hsv_histograms(frames))  # (N, 256) Hellinger-style
    ys = ((np.arange(8) + 0.5) * h / 8).astype(np.intp)
    xs = ((np.arange(8) + 0.5) * w / 8).astype(np.intp)
    thumb = frames[:, ys[:, None], xs[None, :]].reshape(n, -1).astype(np.float32) / 255.0
    thumb = thumb - thumb.mean(axis=1, keepdims=True)  # (N, 192), brightness-invariant
    thumb /= np.linalg.norm(thumb, axis=1, keepdims=True) + 1e-6
    hist /= np.linalg.norm(hist, axis=1, keepdims=True) + 1e-6
    e = np.concatenate([hist, thumb], axis=1)  # (N, 448)
    return e / (np.linalg.norm(e, axis=1, keepdims=True) + 1e-6)


def _boundary_frames(
    frames: np.ndarray | Source, span: Span, *, head: bool, n: int, width: int
) -> np.ndarray:
    """First (head) or last n frames of a span, from an array or decoded from the video."""
    if isinstance(frames, np.ndarray):
        if head:
            return frames[span.start_frame : min(span.end_frame, span.start_frame + n)]
        return frames[max(span.start_frame, span.end_frame - n) : span.end_frame]
    fps = span.n_frames / max(span.duration_s, 1e-9)
    if head:
        a, b = span.start_s, min(span.end_s, span.start_s + n / fps)
    else:
        a, b = max(span.start_s, span.end_s - n / fps), span.end_s
    return decode_frames(frames, width=width, start_s=a, end_s=b)


def stitch(
    spans: list[Span],
    frames: np.ndarray | Source,
    *,
    embed: Embedder = color_thumb_embed,
    threshold: float = 0.9,
    n_boundary: int = 3,
    max_frames: int | None = None,
    width: int = 64,
) -> list[Span]:
    """Merge touching neighbours whose boundary embeddings have cosine similarity >= threshold.

    `frames` are the video's frames (T, H, W, 3) (e.g. the analysis-size frames the splitter
    used) or the video itself, in which case only the boundary frames are decoded (`width` px).
    """
    if len(spans) < 2:
        return list(spans)
    out = [spans[0]]
    for nxt in spans[1:]:
        cur = out[-1]
        touching = cur.end_frame == nxt.start_frame
        fits = max_frames is None or nxt.end_frame - cur.start_frame <= max_frames
        if touching and fits:
            tail = _boundary_frames(frames, cur, head=False, n=n_boundary, width=width)
            head = _boundary_frames(frames, nxt, head=True, n=n_boundary, width=width)
            a = embed(tail).mean(axis=0)  # (D,)
            b = embed(head).mean(axis=0)  # (D,)
            sim = float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b) + 1e-9))
            if sim >= threshold:
                out[-1] = Span(
                    start_frame=cur.start_frame, end_frame=nxt.end_frame,
                    start_s=cur.start_s, end_s=nxt.end_s,
                )  # fmt: skip
                continue
        out.append(nxt)
    return out
