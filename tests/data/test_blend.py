"""Buckets (same-shape batches, savable, DP-consistent) and weighted blending of datasets."""

from __future__ import annotations

import json

import numpy as np
import pytest

from vfm_core.data.blend import BlendedLoader
from vfm_core.data.buckets import BucketSpec, assign_bucket
from vfm_core.data.loader import build_loader

SPEC = BucketSpec(resolutions=((32, 32), (32, 48), (48, 32)), durations=(1, 5, 9))


def test_assign_bucket_by_aspect_then_size_and_duration():
    b = SPEC.buckets()
    assert b[assign_bucket(13, 32, 32, SPEC)] == (32, 32, 9)
    assert b[assign_bucket(9, 40, 64, SPEC)] == (32, 48, 9)  # wide -> wide, never upsampled
    assert b[assign_bucket(1, 64, 48, SPEC)] == (48, 32, 1)  # tall image
    assert b[assign_bucket(5, 48, 48, SPEC)] == (32, 32, 5)
    assert assign_bucket(9, 16, 16, SPEC) is None  # smaller than every shape


def test_bucketed_batches_have_one_shape_and_restore(shard_dir):
    kw = {"seed": 4, "batch_size": 2, "decode": "none", "buckets": SPEC}
    ld = build_loader(shards=str(shard_dir), **kw)
    for _ in range(5):
        b = ld.next_batch()
        assert len(b.samples) == 2 and len({s.bucket for s in b.samples}) == 1
        h, w, t = b.samples[0].bucket
        assert all(s.meta["frames"] >= t and s.meta["height"] >= h for s in b.samples)
    state = json.loads(json.dumps(ld.state_dict()))
    want = [ld.next_batch().keys for _ in range(4)]
    # restored on two DP ranks: the same batches, dealt out in turn
    two = [build_loader(shards=str(shard_dir), dp_rank=r, dp_size=2, **kw) for r in range(2)]
    for x in two:
        x.load_state_dict(state)
    got = []
    for _ in range(2):
        got += [x.next_batch().keys for x in two]
    assert got == want


def test_blend_proportions_exact_in_expectation_and_savable(shard_dir):
    a = build_loader(shards=str(shard_dir), seed=0, batch_size=1, decode="none")
    b = build_loader(shards=str(shard_dir), seed=1, batch_size=1, decode="none")
    blend = BlendedLoader([a, b], [3, 1], seed=7)
    n = 20000
    picks = np.array([blend.choice(s) for s in range(n)])
    share = (picks == 0).mean()
    assert abs(share - 0.75) < 3 * np.sqrt(0.75 * 0.25 / n)  # within 3 sigma of 3:1
    for _ in range(5):
        blend.next_batch()
    state = json.loads(json.dumps(blend.state_dict()))
    want = [(x.source, x.keys) for x in (blend.next_batch() for _ in range(6))]
    again = BlendedLoader(
        [build_loader(shards=str(shard_dir), seed=s, batch_size=1, decode="none") for s in (0, 1)],
        [3, 1],
        seed=7,
    )
    again.load_state_dict(state)
    assert [(x.source, x.keys) for x in (again.next_batch() for _ in range(6))] == want
    with pytest.raises(ValueError, match="blend weights must be finite"):
        BlendedLoader([a, b], [1, -1], seed=0)
    with pytest.raises(ValueError, match="seed/weights"):
        BlendedLoader([a, b], [1, 1], seed=7).load_state_dict(state)
