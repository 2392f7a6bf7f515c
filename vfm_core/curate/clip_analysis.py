"""A clip's filter scores and embedding frames taken while it is encoded, so the annotate stage
does not decode the clip again.

`AnalysisTap` is the transcoder's per-frame hook (`transcode.transcode_span(on_frame=...)`): it
sees every frame handed to the encoder (upright, cropped, at the clip's size and rate) and keeps
the ones the filters score (`filters.sample_indices`: every ``round(fps / sample_fps)``-th),
scaled to the analysis width the way a decode of the clip is (swscale, fast bilinear, RGB).
`finish` scores them (`filters.score_frames`) and keeps only the frames the embedding averages
(`embed.clip_embedding`'s picks), so what waits for the annotate stage is a few kilobytes per
clip, not the clip's frames: a long video's clips stay cheap to hold until they are annotated.

The scores are those of the encoder's input rather than of its decoded output: they differ from
a decode of the clip by the compression error only (crf 23: a fraction of a grey level in the
mean frame difference). `ClipAnalyses` is the hand-over between the two stages of one process
(the local executor); under Ray the stages run in other processes, find nothing, and the
annotate stage decodes the clip as before.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass, field

import av
import numpy as np

from vfm_core.annotate.filters import FilterConfig, FilterScores, score_frames
from vfm_core.video.convert import FrameConverter
from vfm_core.video.io import analysis_size


@dataclass(kw_only=True, slots=True, frozen=True)
class ClipAnalysis:
    """What the annotate stage needs of a clip's pictures."""

    n_frames: int
    """Frames the clip has (the tap saw)."""
    scores: FilterScores
    """Filter scores of the sampled frames."""
    embed_frames: np.ndarray
    """(K, h, w, 3) uint8: the sampled frames the clip embedding averages."""


def sample_step(fps: float, sample_fps: float) -> int:
    """Every how many frames `filters.sample_indices` samples a clip at `fps`."""
    return max(1, int(round(fps / max(sample_fps, 1e-6))))


def embed_picks(n: int, k: int) -> np.ndarray:
    """The indices into `n` sampled frames that `embed.clip_embedding(n=k)` averages."""
    return np.unique(np.linspace(0, n - 1, min(k, n)).round().astype(int))


@dataclass(kw_only=True)
class AnalysisTap:
    """Collects the sampled analysis frames of a clip being encoded (``tap(n, frame)`` per
    output frame ``n``, yuv420p at the clip's size)."""

    width: int
    """Analysis width (`CurateConfig.analysis_width`)."""
    step: int
    """Sample every ``step``-th output frame (`sample_step` of the clip's rate)."""
    n_frames: int = 0
    frames: list[np.ndarray] = field(default_factory=list)
    _fc: FrameConverter = field(default_factory=FrameConverter, repr=False)

    def __call__(self, n: int, frame: av.VideoFrame) -> None:
        self.n_frames = n + 1
        if n % self.step:
            return
        w, h = analysis_size(frame.width, frame.height, self.width)
        rgb = self._fc.convert(
            frame, format="rgb24", width=w, height=h, interpolation="FAST_BILINEAR"
        )
        self.frames.append(rgb.to_ndarray())  # (h, w, 3)

    def finish(self, cfg: FilterConfig, embed_frames: int) -> ClipAnalysis | None:
        """The clip's scores and embedding frames (None when no frame was seen)."""
        if not self.frames:
            return None
        sampled = np.stack(self.frames)  # (T, h, w, 3)
        return ClipAnalysis(
            n_frames=self.n_frames,
            scores=score_frames(sampled, cfg),
            embed_frames=sampled[embed_picks(len(sampled), embed_frames)],
        )


class ClipAnalyses:
    """clip_id -> `ClipAnalysis`, from the transcode stage to the annotate stage of the same
    process; at most `limit` held (oldest dropped: their clips are decoded again)."""

    def __init__(self, limit: int = 4096) -> None:
        self.limit = limit
        self._items: OrderedDict[str, ClipAnalysis] = OrderedDict()
        self._lock = threading.Lock()

    def put(self, clip_id: str, analysis: ClipAnalysis) -> None:
        with self._lock:
            self._items[clip_id] = analysis
            while len(self._items) > self.limit:
                self._items.popitem(last=False)

    def pop(self, clip_id: str) -> ClipAnalysis | None:
        with self._lock:
            return self._items.pop(clip_id, None)

    def __len__(self) -> int:
        return len(self._items)

    def __getstate__(self) -> dict:
        return {"limit": self.limit}  # another process starts empty (Ray actors)

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["limit"])
