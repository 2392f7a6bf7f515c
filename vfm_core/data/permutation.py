"""A seeded bijection of [0, N) with O(1) memory and O(1) work per position: the global sample
order of any dataset size without materialising a permutation of N.

A balanced Feistel network (Luby–Rackoff) permutes the 2h-bit domain [0, 4^h) with 4^h >= N;
positions that land outside [0, N) are walked again ("cycle walking", Black & Rogaway 2002) until
they land inside, which keeps the map a bijection of [0, N). Since 4^h < 4N, a position needs
fewer than 4 rounds of walking on average. The round function is splitmix64 of the half-block
xor a round key; the keys come from (seed, epoch), so every epoch has its own order.
"""

from __future__ import annotations

import numpy as np

_MASK64 = (1 << 64) - 1


def splitmix64(x: int) -> int:
    """The splitmix64 finaliser (Steele, Lea & Flood 2014): a 64-bit integer hash."""
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def _splitmix64_np(x: np.ndarray) -> np.ndarray:
    """Vectorised :func:`splitmix64` over uint64 (wrap-around arithmetic)."""
    with np.errstate(over="ignore"):
        x = x + np.uint64(0x9E3779B97F4A7C15)
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return x ^ (x >> np.uint64(31))


class FeistelPermutation:
    """``perm(i)`` for i in [0, n): a bijection keyed by (seed, epoch).

    >>> p = FeistelPermutation(10, seed=3)
    >>> sorted(p(i) for i in range(10)) == list(range(10))
    True
    """

    def __init__(self, n: int, *, seed: int, epoch: int = 0, rounds: int = 6) -> None:
        if n <= 0:
            raise ValueError(f"FeistelPermutation: n must be positive, got {n}")
        if rounds < 3:
            raise ValueError(f"FeistelPermutation: at least 3 rounds, got {rounds}")
        self.n, self.seed, self.epoch, self.rounds = n, seed, epoch, rounds
        self.half_bits = max(1, ((n - 1).bit_length() + 1) // 2)  # 4^h >= n
        self.half_mask = (1 << self.half_bits) - 1
        base = splitmix64((seed & _MASK64) ^ splitmix64(epoch & _MASK64))
        self.keys = [splitmix64(base ^ splitmix64(r + 1)) for r in range(rounds)]

    def _encrypt(self, x: int) -> int:
        left, right = x >> self.half_bits, x & self.half_mask
        for k in self.keys:
            left, right = right, left ^ (splitmix64(right ^ k) & self.half_mask)
        return (left << self.half_bits) | right

    def _decrypt(self, x: int) -> int:
        left, right = x >> self.half_bits, x & self.half_mask
        for k in reversed(self.keys):
            left, right = right ^ (splitmix64(left ^ k) & self.half_mask), left
        return (left << self.half_bits) | right

    def __call__(self, i: int) -> int:
        if not 0 <= i < self.n:
            raise IndexError(f"position {i} outside [0, {self.n})")
        x = self._encrypt(i)
        while x >= self.n:  # cycle walking: stays a bijection of [0, n)
            x = self._encrypt(x)
        return x

    def inverse(self, j: int) -> int:
        if not 0 <= j < self.n:
            raise IndexError(f"value {j} outside [0, {self.n})")
        x = self._decrypt(j)
        while x >= self.n:
            x = self._decrypt(x)
        return x

    def map(self, positions: np.ndarray) -> np.ndarray:
        """Vectorised ``self(i)`` over an integer array (same values as the scalar form)."""
        x = np.asarray(positions, dtype=np.int64)
        if x.size and (x.min() < 0 or x.max() >= self.n):
            raise IndexError(f"positions outside [0, {self.n})")
        x = x.astype(np.uint64)
        hb, hm = np.uint64(self.half_bits), np.uint64(self.half_mask)
        keys = [np.uint64(k) for k in self.keys]

        def encrypt(v: np.ndarray) -> np.ndarray:
            left, right = v >> hb, v & hm
            for k in keys:
                left, right = right, left ^ (_splitmix64_np(right ^ k) & hm)
            return (left << hb) | right

        out = encrypt(x)
        todo = out >= np.uint64(self.n)
        while todo.any():
            out[todo] = encrypt(out[todo])
            todo = out >= np.uint64(self.n)
        return out.astype(np.int64)
