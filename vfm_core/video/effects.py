"""Frame-wise effects that `video.compositions` puts on real footage, each with exact truth: a
camera flash, a whip pan, a dissolve and a fade through black. Pure numpy on RGB uint8 frames
(T, H, W, 3); every function returns new frames and leaves its input alone.

- `flash`: frames brightened towards white by `profile` (the first near-white, then decaying), the
  shot continuing unchanged after it: no cut, the shot's frames all belong to it;
- `whip_pan`: a crop window that rests at the left of a wider frame, whips to the right within a
  few frames (each pan frame motion-blurred over its displacement) and rests there: one shot, two
  views of the same set;
- `dissolve`: frame-wise linear blend A -> B, alpha = (i + 1) / (n + 1);
- `fade`: A fades to black over the first half, B fades in from black over the rest.
"""

from __future__ import annotations

import numpy as np

FLASH_PROFILE = (0.92, 0.7, 0.35)
"""Share of the way to white of each flash frame: near-white, then the flash decays."""


def flash(frames: np.ndarray, at: int, profile: tuple[float, ...] = FLASH_PROFILE) -> np.ndarray:
    """`frames` with frames at, at+1, ... brightened: x + (255 - x) * profile[i]."""
    out = frames.copy()
    for i, p in enumerate(profile):
        if at + i < len(out):
            f = out[at + i].astype(np.float32)
            out[at + i] = np.clip(f + (255.0 - f) * p + 0.5, 0, 255).astype(np.uint8)
    return out


def whip_pan(wide: np.ndarray, width: int, at: int, n: int) -> np.ndarray:
    """(T, H, W', 3) frames of a wider picture -> (T, H, width, 3): the crop rests at x = 0 before
    frame `at`, moves linearly to x = W' - width over frames [at, at + n) and rests there after;
    each moving frame is a box blur over its displacement (a camera's motion blur)."""
    t_n, _, wide_w, _ = wide.shape
    travel = wide_w - width
    if travel <= 0:
        raise ValueError(f"whip_pan: frames {wide_w} px wide leave no room to pan {width} px")
    step = travel / max(n, 1)  # px per frame
    out = np.empty((t_n, wide.shape[1], width, 3), np.uint8)
    for t in range(t_n):
        if t < at:
            out[t] = wide[t, :, :width]
        elif t >= at + n:
            out[t] = wide[t, :, travel:]
        else:
            x = (t - at + 0.5) * step  # crop position at mid-exposure
            lo = int(np.clip(round(x - step / 2), 0, travel))
            hi = int(np.clip(round(x + step / 2), lo + 1, travel + 1))
            # mean of the crops at x = lo .. hi - 1: a box filter over the displacement
            c = np.cumsum(wide[t].astype(np.float32), axis=1)  # (H, W', 3)
            c = np.concatenate([np.zeros_like(c[:, :1]), c], axis=1)  # (H, W' + 1, 3)
            k = hi - lo
            s = c[:, lo + k : lo + k + width] - c[:, lo : lo + width]  # sums of k columns
            out[t] = np.clip(s / k + 0.5, 0, 255).astype(np.uint8)
    return out


def dissolve(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """(n, H, W, 3) x 2 -> the n blended frames, B's weight (i + 1) / (n + 1)."""
    n = len(a)
    if len(b) != n:
        raise ValueError(f"dissolve: {len(a)} frames of A, {len(b)} of B")
    w = (np.arange(1, n + 1, dtype=np.float32) / (n + 1))[:, None, None, None]
    return np.clip((1 - w) * a + w * b + 0.5, 0, 255).astype(np.uint8)


def fade(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """A's frames (h, ...) fading to black then B's (n - h, ...) fading in: (h + n - h, ...)."""
    ga = (1.0 - np.arange(1, len(a) + 1, dtype=np.float32) / (len(a) + 1))[:, None, None, None]
    gb = (np.arange(1, len(b) + 1, dtype=np.float32) / (len(b) + 1))[:, None, None, None]
    out = np.concatenate([ga * a, gb * b])
    return np.clip(out + 0.5, 0, 255).astype(np.uint8)
