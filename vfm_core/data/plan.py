"""The global sample order and the step planner: which samples every rank gets at every step.

Rule (documented contract of the loader):

1. **Global order.** Global position ``g`` (0, 1, 2, ...) is sample ``perm_e[g % N]`` of epoch
   ``e = g // N``, with ``perm_e`` the Feistel permutation keyed by ``(seed, e)`` (O(1) memory
   and work per position at any N). It depends on nothing else — not on ranks, workers or batch
   size.
2. **Unpacked** (``max_tokens=None``): step ``s`` consumes global positions ``[c, c + dp*B)``
   where ``c`` is the cursor; DP rank ``r`` takes ``[c + r*B, c + (r+1)*B)``. The state is the
   cursor, so a restore with another ``dp_size`` continues the same global order (the next
   ``dp'*B`` positions are split over the new ranks).
3. **Packed** (``max_tokens=N``): one global packer consumes positions in order into a buffer of
   ``buffer_size`` samples, runs first-fit-decreasing on token counts read from the index (no
   data is read to plan), emits packs that are full to within ``slack`` (or hold a sample older
   than ``max_age``), and flushes at every epoch end, so packs never mix epochs. Packs form one
   global sequence; step ``s`` hands packs ``[p, p + dp*B)`` out as DP rank ``r`` taking
   ``[p + r*B, p + (r+1)*B)``. State = (next position, buffer, queued packs), all global, so a
   restore with another ``dp_size`` continues the same pack sequence. Packing parameters
   (``max_tokens``, ``buffer_size``, ``slack``) must match on restore.
4. **Workers** only decode what the plan chose, so ``num_workers`` never changes the order.
5. Samples longer than ``max_tokens`` are skipped for every rank alike (decided from the index)
   and counted.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from vfm_core.data.packing import first_fit_decreasing
from vfm_core.data.permutation import FeistelPermutation


class GlobalOrder:
    """Position -> (epoch, sample index); a pure function of (seed, position).

    Each epoch's order is a Feistel permutation keyed by (seed, epoch)
    (:class:`~vfm_core.data.permutation.FeistelPermutation`): O(1) memory and O(1) work per
    position whatever the dataset size, nothing materialised per epoch."""

    def __init__(self, n: int, seed: int) -> None:
        if n <= 0:
            raise ValueError("dataset is empty")
        self.n, self.seed = n, seed
        self._epochs: dict[int, FeistelPermutation] = {}
        self._recent: dict[int, int] = {}  # position -> sample (the planner asks again)
        self._lock = threading.Lock()

    def epoch_order(self, epoch: int) -> FeistelPermutation:
        with self._lock:
            p = self._epochs.get(epoch)
            if p is None:
                p = self._epochs[epoch] = FeistelPermutation(self.n, seed=self.seed, epoch=epoch)
                while len(self._epochs) > 3:
                    self._epochs.pop(min(self._epochs))
            return p

    def perm(self, epoch: int) -> np.ndarray:
        """The whole order of epoch ``epoch`` (N,): for small datasets and tests only."""
        return self.epoch_order(epoch).map(np.arange(self.n))

    def sample(self, position: int) -> int:
        hit = self._recent.get(position)
        if hit is not None:
            return hit
        out = self.epoch_order(position // self.n)(position % self.n)
        with self._lock:
            if len(self._recent) >= 1 << 16:
                self._recent.clear()
            self._recent[position] = out
        return out


@dataclass(kw_only=True, slots=True)
class PlannerState:
    """Global, JSON-friendly planner state (identical on every rank)."""

    position: int = 0
    """Next global position to consume (unpacked) or to feed the packer (packed)."""
    buffer: list[int] = field(default_factory=list)
    """Packed: positions waiting in the packing buffer."""
    queue: list[list[int]] = field(default_factory=list)
    """Packed: emitted packs (lists of positions) not yet handed out."""
    steps: int = 0
    """Steps planned so far."""
    skipped: list[int] = field(default_factory=list)
    """Positions skipped as too long for max_tokens (last few, for the log)."""
    n_skipped: int = 0


class Planner:
    """Plans steps: per DP rank a list of groups of global positions (one group per pack, or one
    group of B samples when unpacked)."""

    def __init__(
        self,
        order: GlobalOrder,
        tokens: Callable[[int], int],
        *,
        batch_size: int,
        max_tokens: int | None,
        buffer_size: int = 64,
        slack: float = 0.03,
        max_age: int | None = None,
    ) -> None:
        self.order, self.tokens = order, tokens
        self.batch_size, self.max_tokens = batch_size, max_tokens
        self.buffer_size, self.slack = buffer_size, slack
        self.max_age = max_age if max_age is not None else 4 * buffer_size
        self.state = PlannerState()

    # ------------------------------------------------------------------ unpacked
    def _step_unpacked(self, dp_size: int) -> list[list[list[int]]]:
        b, c = self.batch_size, self.state.position
        self.state.position += dp_size * b
        return [[list(range(c + r * b, c + (r + 1) * b))] for r in range(dp_size)]

    # ------------------------------------------------------------------ packed
    def _fits(self, pos: int) -> bool:
        assert self.max_tokens is not None
        n = self.tokens(self.order.sample(pos))
        if n <= self.max_tokens:
            return True
        self.state.n_skipped += 1
        self.state.skipped = (self.state.skipped + [pos])[-16:]
        return False

    def _refill(self) -> None:
        st, n = self.state, self.order.n
        epoch_end = (st.position // n + 1) * n
        while len(st.buffer) < self.buffer_size and st.position < epoch_end:
            if self._fits(st.position):
                st.buffer.append(st.position)
            st.position += 1
        flush = st.position == epoch_end
        lengths = [self.tokens(self.order.sample(p)) for p in st.buffer]
        bins = [[st.buffer[i] for i in b] for b in first_fit_decreasing(lengths, self.max_tokens)]
        if flush:
            emit = bins
        else:
            full = (1 - self.slack) * self.max_tokens
            oldest = st.position - self.max_age
            emit = [
                b
                for b in bins
                if sum(self.tokens(self.order.sample(p)) for p in b) >= full or min(b) < oldest
            ]
            if not emit and bins:
                emit = [bins[0]]  # FFD's first bin is the fullest-started: guarantees progress
        taken = {p for b in emit for p in b}
        st.buffer = [p for p in st.buffer if p not in taken]
        st.queue.extend(sorted((sorted(b) for b in emit), key=lambda b: b[0]))

    def _step_packed(self, dp_size: int) -> list[list[list[int]]]:
        need = dp_size * self.batch_size
        while len(self.state.queue) < need:
            self._refill()
        packs, self.state.queue = self.state.queue[:need], self.state.queue[need:]
        b = self.batch_size
        return [packs[r * b : (r + 1) * b] for r in range(dp_size)]

    # ------------------------------------------------------------------ API
    def next_step(self, dp_size: int) -> list[list[list[int]]]:
        """Plan one global step: ``plan[r]`` is DP rank r's list of groups of positions."""
        plan = (
            self._step_unpacked(dp_size) if self.max_tokens is None else self._step_packed(dp_size)
        )
        self.state.steps += 1
        return plan

    def state_dict(self) -> dict:
        s = self.state
        return {
            "position": s.position,
            "buffer": list(s.buffer),
            "queue": [list(b) for b in s.queue],
            "steps": s.steps,
            "skipped": list(s.skipped),
            "n_skipped": s.n_skipped,
        }

    def load_state_dict(self, d: dict) -> None:
        self.state = PlannerState(
            position=int(d["position"]),
            buffer=[int(p) for p in d["buffer"]],
            queue=[[int(p) for p in b] for b in d["queue"]],
            steps=int(d["steps"]),
            skipped=[int(p) for p in d.get("skipped", [])],
            n_skipped=int(d.get("n_skipped", 0)),
        )


def epoch_positions(plan_groups: Sequence[list[int]]) -> list[int]:
    """Flatten one rank's groups of positions."""
    return [p for g in plan_groups for p in g]
