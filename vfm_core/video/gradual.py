"""What tells a transition from the same shot moving: flashes, and dissolves / fades found and
verified on the per-frame features (`FrameFeatures.hist` and `.grid`), for `ColorChangeSplitter`.

The distance of two frames i, j is the colour splitter's, on any pair:

    dist(i, j) = 0.7 x half-L1(hist[i], hist[j]) + 0.3 x min(1, 4 x mean |dY| / 255)

with dY the difference of the grids' block-mean lumas.

**Flash** (`is_flash`): a cut candidate at t is a flash (or any insert of a few frames) when the
picture returns: some frame of the `k` before t is close to some frame of the `k` from t on
(dist below `ratio` x the step dist(t - 1, t)). A camera flash changes the picture for 1-3 frames
and gives it back; a cut never does.

**Gradual transitions** (`find_gradual`): a candidate is a pair of frames (p, q), p the last of
shot A, q the first of shot B, from two sources: runs of elevated frame-to-frame change (the fast
ones, a few frames) and, for every scale w in `scales_s`, the local maxima of dist(t, t + w) (the
slow ones, 0.5-2 s, whose per-frame change is lost in motion; TransNetV2 and PySceneDetect's
AdaptiveDetector also look beyond the frame pair). A candidate is a transition when

1. the net change dist(p, q) >= `net_min`, spread over the window: no single step in it
   exceeds `step_share` x the net change (that is a cut, or a cut inside motion);
2. the content beyond the window differs on both sides: no frame of the `m` before p is close to
   a frame of the `m` after q (< `return_share` x net), and each side is stable (the change over
   `m` frames outside is below `stable_share` x net): same-shot motion moves on, or comes back;
3. every frame in between is a blend of the ends in the block-mean RGB grid: x ~ a x grid[p] +
   b x grid[q], a, b >= 0 (a dissolve: a + b = 1; a fade: one of them 0), the median residual below
   `blend_tol` x |grid[p] - grid[q]|. A whip pan or fast motion smears and moves the picture:
   no blend of its ends;
4. the ends are not one picture moved: grid[q] matches no shift of grid[p] by whole cells (half
   of it overlapping) within `moved_share` x |grid[p] - grid[q]| (`shifted_match`; a pan's ends
   do, two shots' do not).

Its span is then trimmed to the frames that are not yet (still) shot A (B) by the fit: b / (a + b)
beyond `pure` and a + b within `pure` of 1, so a transition is never longer than its blend; for a
dissolve (a + b ~ 1) the straight line fitted to the B weights b / (a + b) then extends it to where
the line is 0 and 1 (inside the window), so that its faintest first and last frames, which the
`pure` test leaves to the shots, are dropped too. All numpy on (T, bins) / (T, 9, 16, 3) arrays
the decode already made.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from vfm_core.video.frame_features import luma


def frame_dist(hist: np.ndarray, y: np.ndarray, i, j) -> np.ndarray:
    """dist of frames i and j (index arrays that broadcast): hist (T, bins), y (T, gh, gw)."""
    hd = 0.5 * np.abs(hist[i] - hist[j]).sum(-1)
    gd = np.abs(y[i] - y[j]).mean(axis=(-2, -1)) / 255.0
    return 0.7 * hd + 0.3 * np.minimum(1.0, 4.0 * gd)


def is_flash(hist: np.ndarray, y: np.ndarray, t: int, k: int, ratio: float) -> bool:
    """Whether the picture before t comes back within k frames (a flash, not a cut at t)."""
    t_n = len(hist)
    before = np.arange(max(0, t - k), t)
    after = np.arange(t, min(t_n, t + k + 1))
    if before.size == 0 or after.size == 0:
        return False
    d = frame_dist(hist, y, before[:, None], after[None, :])  # (k, k + 1)
    d[(before[:, None] == t - 1) & (after[None, :] == t)] = np.inf  # the step itself
    step = float(frame_dist(hist, y, t - 1, t))
    return float(d.min()) < ratio * step


@dataclass(kw_only=True, slots=True)
class GradualRules:
    """Thresholds of `find_gradual` (see the module docstring)."""

    scales_s: tuple[float, ...] = (0.32, 0.64, 1.28, 2.4)
    """Windows (seconds) of the scan: a transition up to the largest less 2 frames is found."""
    net_min: float = 0.3
    """Net change across a transition (dist, 0..1)."""
    hist_min: float = 0.42
    """... and of its colours alone (half-L1 of the histograms): a camera moving within one set
    (a whip pan, fast motion) changes the layout, not the palette."""
    step_share: float = 0.5
    """No single frame step of the grid may carry more than this share of its net change."""
    stable_share: float = 0.4
    """The change over `m` frames just outside must be below this share of the net change."""
    return_share: float = 0.5
    """... and no frame outside on one side may be this close (share of net) to the other side."""
    m: int = 8
    """Frames looked at on each side."""
    blend_tol: float = 0.3
    """Median residual of the blend fit, as a share of |grid[p] - grid[q]|."""
    moved_share: float = 0.35
    """The ends are one picture moved (a pan) when the grid of q matches the grid of p shifted by
    some cells (at least half of it overlapping) within this share of |grid[p] - grid[q]|."""
    pure: float = 0.1
    """A frame is still shot A (B) when its B (A) weight is below this and a + b within it of 1."""
    min_frames: int = 4
    """Shortest transition (a cut is one step)."""


def find_gradual(
    hist: np.ndarray, grid: np.ndarray, fps: float, rules: GradualRules
) -> list[tuple[int, int]]:
    """[start, end) of the verified dissolves / fades. hist (T, bins), grid (T, gh, gw, 3)."""
    t_n, r = len(hist), rules
    y = luma(grid)  # (T, gh, gw)
    g = grid.reshape(t_n, -1)  # (T, D)
    gstep = np.zeros(t_n, np.float32)
    gstep[1:] = np.abs(np.diff(g, axis=0)).mean(1)  # (T,) grid change per frame
    found: list[tuple[float, int, int, int, int]] = []  # (residual share, start, end, ramp's)
    for sc in r.scales_s:
        w = max(3, int(round(sc * fps)))
        if t_n <= w:
            continue
        p = np.arange(t_n - w)
        q = p + w
        net = frame_dist(hist, y, p, q)  # (T - w,)
        scale = np.abs(g[p] - g[q]).mean(1)  # (T - w,)
        biggest = np.lib.stride_tricks.sliding_window_view(gstep[1:], w).max(1)  # steps p+1..q
        side = np.maximum(
            frame_dist(hist, y, np.maximum(p - r.m, 0), p),
            frame_dist(hist, y, q, np.minimum(q + r.m, t_n - 1)),
        )
        hd = 0.5 * np.abs(hist[p] - hist[q]).sum(1)  # (T - w,)
        ok = (net >= r.net_min) & (hd >= r.hist_min) & (scale >= 1.0)
        ok &= biggest <= r.step_share * scale
        ok &= side <= r.stable_share * net
        for i in np.flatnonzero(ok):
            hit = _verify(hist, y, grid, int(p[i]), int(q[i]), float(net[i]), r)
            if hit is not None:
                found.append(hit)
    # overlapping answers are one transition: the best-fitting window's span (extended to
    # where its dissolve's ramp of weights reaches 0 and 1) is kept, best fit first, and an
    # answer overlapping a kept one is dropped; so a long window that bridges two transitions
    # (and the short shot between them) does not hide either
    kept: list[tuple[int, int]] = []
    for _, _, _, xs, xe in sorted(found):
        if not any(xs < b and a < xe for a, b in kept):
            kept.append((xs, xe))
    return sorted(kept)


def _verify(hist, y, grid, p: int, q: int, net: float, r: GradualRules):
    """(residual share, start, end, ramp start, ramp end) of candidate (p, q) trimmed to its
    blend (and extended to its dissolve's ramp), or None."""
    t_n = len(hist)
    g = grid.reshape(t_n, -1)  # (T, D)
    before = np.arange(max(0, p - r.m), p + 1)
    after = np.arange(q, min(t_n, q + r.m + 1))
    if frame_dist(hist, y, before[:, None], after[None, :]).min() < r.return_share * net:
        return None  # the content comes back: the same shot
    ga, gb, x = g[p], g[q], g[p + 1 : q]  # (D,), (D,), (n, D)
    scale = float(np.abs(ga - gb).mean())
    a, b = _nonneg_fit(ga, gb, x)  # (n,), (n,)
    res = np.abs(x - a[:, None] * ga - b[:, None] * gb).mean(1)  # (n,)
    share = float(np.median(res)) / scale
    if share > r.blend_tol:
        return None  # not a blend of its ends: motion
    if shifted_match(grid[p], grid[q]) < r.moved_share * scale:
        return None  # the same picture, moved: a pan
    tot = a + b
    wb = b / np.maximum(tot, 1e-6)
    pure_a = (wb < r.pure) & (np.abs(tot - 1) < r.pure)
    pure_b = (wb > 1 - r.pure) & (np.abs(tot - 1) < r.pure)
    inner = np.flatnonzero(~pure_a & ~pure_b)
    if inner.size == 0:
        return None
    s, e = p + 1 + int(inner[0]), p + 2 + int(inner[-1])
    if e - s < r.min_frames:
        return None
    xs, xe = s, e
    ramp = _ramp(wb, np.abs(tot - 1) < r.pure, r.pure)
    if ramp is not None:  # a dissolve: its first (last) frames carry < `pure` of B (A) too
        xs, xe = min(s, p + 1 + ramp[0]), max(e, p + 1 + ramp[1])
    return share, s, e, xs, xe


def _ramp(wb: np.ndarray, mixed: np.ndarray, pure: float) -> tuple[int, int] | None:
    """[first, end) of the frames (indices into wb) where the straight line fitted to the B
    weights wb of the dissolving frames (`mixed`: a + b ~ 1, `pure` < wb < 1 - `pure`) lies
    strictly between 0 and 1, clipped to wb's frames; None when they do not follow a line."""
    i = np.flatnonzero(mixed & (wb > pure) & (wb < 1 - pure))
    if i.size < 4:
        return None
    slope, icpt = np.polyfit(i, wb[i], 1)
    if slope <= 0 or np.median(np.abs(wb[i] - (slope * i + icpt))) > pure:
        return None
    t0, t1 = -icpt / slope, (1 - icpt) / slope  # where the line is 0 and 1
    first = max(0, int(np.floor(t0)) + 1)
    end = min(len(wb), int(np.ceil(t1)))
    return (first, end) if end > first else None


def shifted_match(ga: np.ndarray, gb: np.ndarray, min_overlap: float = 0.5) -> float:
    """Smallest mean |ga - gb| over the overlap of the two grids (gh, gw, C) shifted against each
    other by whole cells (not both zero), at least `min_overlap` of each side overlapping: small
    when gb is ga's picture moved (a camera pan), as large as |ga - gb| for two shots.

    All shifts at once: gb padded with NaN by the largest shift, every (gh, gw) window of it set
    against ga (window (my - dy, mx - dx) pairs ga[y, x] with gb[y - dy, x - dx]), the mean taken
    over the cells both have (the same as shift by shift: tests/video/test_shots.py)."""
    gh, gw = ga.shape[:2]
    my, mx = int(gh * (1 - min_overlap)), int(gw * (1 - min_overlap))
    if my == 0 and mx == 0:
        return np.inf
    pad = ((my, my), (mx, mx), (0, 0))
    p = np.pad(gb.astype(np.float64), pad, constant_values=np.nan)  # (gh + 2my, gw + 2mx, C)
    win = np.lib.stride_tricks.sliding_window_view(p, (gh, gw), axis=(0, 1))  # (Y, X, C, gh, gw)
    d = np.abs(np.moveaxis(ga, (0, 1), (-2, -1)) - win)  # (2my + 1, 2mx + 1, C, gh, gw)
    ok = ~np.isnan(d)
    means = np.where(ok, d, 0).sum((2, 3, 4)) / ok.sum((2, 3, 4))  # (2my + 1, 2mx + 1)
    means[my, mx] = np.inf  # no shift
    return float(means.min())


def _nonneg_fit(ga: np.ndarray, gb: np.ndarray, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Least squares x ~ a ga + b gb with a, b >= 0, per row of x (n, D) -> (n,), (n,)."""
    aa, bb, ab = float(ga @ ga), float(gb @ gb), float(ga @ gb)
    xa, xb = x @ ga, x @ gb  # (n,)
    det = max(aa * bb - ab * ab, 1e-6 * aa * bb + 1e-12)
    a = (xa * bb - xb * ab) / det
    b = (xb * aa - xa * ab) / det
    only_b = a < 0  # best with a = 0
    only_a = b < 0
    a = np.where(only_b, 0.0, np.where(only_a, np.maximum(xa / max(aa, 1e-12), 0), a))
    b = np.where(only_a, 0.0, np.where(only_b, np.maximum(xb / max(bb, 1e-12), 0), b))
    return a, b
