"""The global order's permutation: a bijection of [0, N) for any N, keyed by (seed, epoch), the
vectorised and inverse forms agree with the scalar one, and positions spread like a random
permutation (no identity-like structure)."""

from __future__ import annotations

import numpy as np
import pytest

from vfm_core.data.permutation import FeistelPermutation
from vfm_core.data.plan import GlobalOrder


@pytest.mark.parametrize("n", [1, 2, 3, 7, 1000, 2**16 + 3])
def test_bijection_inverse_and_vectorised(n):
    p = FeistelPermutation(n, seed=5, epoch=2)
    values = [p(i) for i in range(n)]
    assert sorted(values) == list(range(n))
    assert list(p.map(np.arange(n))) == values
    assert all(p.inverse(v) == i for i, v in enumerate(values[:500]))


def test_keyed_by_seed_and_epoch_and_spread():
    n = 100_000
    a = FeistelPermutation(n, seed=0).map(np.arange(n))
    assert not np.array_equal(a, FeistelPermutation(n, seed=1).map(np.arange(n)))
    assert not np.array_equal(a, FeistelPermutation(n, seed=0, epoch=1).map(np.arange(n)))
    # a uniform random permutation moves an element by n/3 on average
    assert abs(np.abs(a - np.arange(n)).mean() / n - 1 / 3) < 0.01
    fixed = int((a == np.arange(n)).sum())
    assert fixed < 10  # ~1 expected


def test_huge_n_needs_no_table():
    p = FeistelPermutation(10**12, seed=3)
    got = p.map(np.array([0, 1, 10**12 - 1]))
    assert (got >= 0).all() and (got < 10**12).all() and len(set(got.tolist())) == 3
    assert [p(int(i)) for i in [0, 1, 10**12 - 1]] == got.tolist()


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="n must be positive"):
        FeistelPermutation(0, seed=0)
    with pytest.raises(IndexError, match="outside"):
        FeistelPermutation(5, seed=0)(5)


def test_global_order_covers_every_epoch():
    order = GlobalOrder(37, seed=9)
    for epoch in range(3):
        seen = [order.sample(epoch * 37 + i) for i in range(37)]
        assert sorted(seen) == list(range(37))
        assert seen == list(order.perm(epoch))
    assert list(order.perm(0)) != list(order.perm(1))
