"""A clip's filter scores and embedding frames taken while it is encoded, so the annotate stage
does not decode the clip again.

`AnalysisTap` is the transcoder's per-frame hook (`transcode.transcode_span(on_frame=...)`): it
sees every frame handed to the encoder (upright, cropped, at the clip's size and rate) and keeps
the ones the filters score (`filters.sample_indices`: every ``round(fps / sample_fps)``-th),
scaled to the analysis width the way a decode of the clip is (swscale, fast bilinear, RGB).
`finish` scores them (`filters.score_frames`) and keeps only the frames the embedding averages
(`embed.clip_embedding`'s picks) as a `records.ClipScores` on the `ClipTask`: a few kilobytes
per clip, JSON like every item (the Ray executor moves it too), not the clip's frames.

The scores are those of the encoder's input rather than of its decoded output: they differ from
a decode of the clip by the compression error only. Measured on the real clips of the installed
wheels (crf 23): the mean frame difference (``motion``) 3-13 % higher (x264 smooths grain),
static / black / blank fractions identical, embeddings cosine >= 0.99 to the decoded ones.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass, field

import av
import numpy as np

from vfm_core.annotate.filters import FilterConfig, FilterScores, score_frames
from vfm_core.curate.records import ClipScores
from vfm_core.video.convert import FrameConverter
from vfm_core.video.io import analysis_size


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

    def finish(self, cfg: FilterConfig, embed_frames: int) -> ClipScores | None:
        """The clip's scores and embedding frames (None when no frame was seen)."""
        if not self.frames:
            return None
        sampled = np.stack(self.frames)  # (T, h, w, 3)
        s = score_frames(sampled, cfg)
        thumbs = np.ascontiguousarray(sampled[embed_picks(len(sampled), embed_frames)])
        return ClipScores(
            n_frames=self.n_frames,
            motion=s.motion,
            static_frac=s.static_frac,
            black_frac=s.black_frac,
            blank_frac=s.blank_frac,
            pan_px=s.pan_px,
            thumbs=base64.b64encode(thumbs.tobytes()).decode("ascii"),
            thumbs_shape=list(thumbs.shape),
        )


def filter_scores(c: ClipScores) -> FilterScores:
    """The `FilterScores` of `c`."""
    return FilterScores(
        motion=c.motion,
        static_frac=c.static_frac,
        black_frac=c.black_frac,
        blank_frac=c.blank_frac,
        pan_px=c.pan_px,
    )


def thumbs(c: ClipScores) -> np.ndarray:
    """The embedding's frames of `c`: (K, h, w, 3) uint8."""
    raw = np.frombuffer(base64.b64decode(c.thumbs), np.uint8)
    return raw.reshape(c.thumbs_shape)
