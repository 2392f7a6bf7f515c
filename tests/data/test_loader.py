"""The loader's four contracts: exact restore in a new process, disjoint DP ranks covering the
epoch, restore with another dp_size / num_workers, model-parallel read-then-gather (gloo)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch.multiprocessing as mp
from datagen import free_port
from loader_worker import batch_digest, mp_rank_main

from vfm_core.data.loader import LoaderStateError, build_loader

WORKER = Path(__file__).with_name("loader_worker.py")
PACKED = {"max_tokens": 96, "buffer_size": 16}


def positions(batch) -> list[int]:
    return [s.position for s in batch.samples]


@pytest.mark.parametrize("mode", [{}, PACKED], ids=["unpacked", "packed"])
def test_restore_in_new_process_is_bit_identical(shard_dir, tmp_path, mode):
    kw = {"seed": 5, "batch_size": 2, **mode}
    loader = build_loader(shards=str(shard_dir), **kw)
    for _ in range(3):
        loader.next_batch()
    state = loader.state_dict()
    text = json.dumps(state)  # small, JSON, versioned
    assert len(text) < 2000 and state["version"] == 2
    expected = [batch_digest(loader.next_batch()) for _ in range(5)]
    (tmp_path / "state.json").write_text(text)
    # the new process also uses 2 reader threads: workers never change the batches
    args = [
        sys.executable,
        str(WORKER),
        str(shard_dir),
        str(tmp_path / "state.json"),
        "5",
        json.dumps({**kw, "num_workers": 2}),
    ]
    out = subprocess.run(args, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert json.loads(out.stdout.strip().splitlines()[-1]) == expected


def test_batches_hold_keys_frames_and_packs(shard_dir):
    loader = build_loader(shards=str(shard_dir), seed=0, batch_size=2, **PACKED)
    b = loader.next_batch()
    assert b.keys == b["keys"] and len(b.keys) == len(b.samples) > 0
    for pack, members in zip(b.packs, b.pack_members):
        assert pack.length == 96 and pack.n_tokens <= 96
        assert [b.samples[m].grid for m in members] == pack.grids
    s = b.samples[0]
    assert s.frames.dtype.name == "uint8" and s.frames.shape[-1] == 3
    assert s.frames.shape[:3] == (s.meta["frames"], s.meta["height"], s.meta["width"])


@pytest.mark.parametrize("mode", [{}, PACKED], ids=["unpacked", "packed"])
def test_dp_ranks_disjoint_and_cover_each_epoch(shard_dir, mode):
    n, dp = 24, 3
    loaders = [
        build_loader(
            shards=str(shard_dir),
            seed=1,
            dp_rank=r,
            dp_size=dp,
            batch_size=2,
            decode="none",
            **mode,
        )
        for r in range(dp)
    ]
    seen: list[int] = []
    for _ in range(12):
        for ld in loaders:
            seen += positions(ld.next_batch())
    assert len(seen) == len(set(seen))  # no sample twice, across ranks and steps
    skipped = loaders[0].planner.state.n_skipped
    epoch0 = sorted(p for p in seen if p < n)
    assert len(epoch0) == n - skipped  # every sample of epoch 0 exactly once (minus too long)
    assert len({loaders[0].order.sample(p) for p in epoch0}) == len(epoch0)  # distinct samples
    # a fresh permutation per epoch, drawn from (seed, epoch)
    assert list(loaders[0].order.perm(0)) != list(loaders[0].order.perm(1))


def test_restore_with_other_dp_size_and_workers_continues_global_order(shard_dir):
    # reference: one rank, one group per step, same global sequence
    ref = build_loader(shards=str(shard_dir), seed=2, batch_size=1, decode="none", **PACKED)
    ref_packs = [positions(ref.next_batch()) for _ in range(20)]
    # 2 ranks for 3 steps -> packs 0..5; then 3 ranks with 2 workers -> packs 6.. in order
    two = [
        build_loader(
            shards=str(shard_dir),
            seed=2,
            dp_rank=r,
            dp_size=2,
            batch_size=1,
            decode="none",
            **PACKED,
        )
        for r in range(2)
    ]
    got = []
    for _ in range(3):
        got += [positions(ld.next_batch()) for ld in two]
    state = json.loads(json.dumps(two[0].state_dict()))
    assert state == two[1].state_dict()  # the state is global: identical on every rank
    three = [
        build_loader(
            shards=str(shard_dir),
            seed=2,
            dp_rank=r,
            dp_size=3,
            batch_size=1,
            num_workers=2,
            decode="none",
            **PACKED,
        )
        for r in range(3)
    ]
    for ld in three:
        ld.load_state_dict(state)
    for _ in range(4):
        got += [positions(ld.next_batch()) for ld in three]
    assert got == ref_packs[: len(got)]
    # unpacked: the global cursor continues the same order
    a = build_loader(shards=str(shard_dir), seed=2, batch_size=3, decode="none")
    a.next_batch()
    b = [
        build_loader(
            shards=str(shard_dir), seed=2, dp_rank=r, dp_size=2, batch_size=3, decode="none"
        )
        for r in range(2)
    ]
    for ld in b:
        ld.load_state_dict(a.state_dict())
    assert positions(b[0].next_batch()) + positions(b[1].next_batch()) == list(range(3, 9))


def test_state_from_other_dataset_or_packing_is_refused(shard_dir):
    a = build_loader(shards=str(shard_dir), seed=0, decode="none")
    b = build_loader(shards=str(shard_dir), seed=1, decode="none")
    with pytest.raises(LoaderStateError, match="seed: state 0 vs loader 1"):
        b.load_state_dict(a.state_dict())
    c = build_loader(shards=str(shard_dir), seed=0, decode="none", max_tokens=64)
    with pytest.raises(LoaderStateError, match="max_tokens"):
        c.load_state_dict(a.state_dict())
    with pytest.raises(LoaderStateError, match="not a shard loader state"):
        a.load_state_dict({"version": 1, "kind": "synthetic", "position": 0})


@pytest.mark.slow
def test_model_parallel_read_then_gather(shard_dir, tmp_path):
    world, steps = 4, 3
    mp.spawn(
        mp_rank_main,
        args=(world, free_port(), str(shard_dir), str(tmp_path), steps),
        nprocs=world,
        join=True,
    )
    res = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(world)]
    # each group holds one identical batch per step; the two DP replicas differ
    assert res[0]["digests"] == res[1]["digests"] and res[2]["digests"] == res[3]["digests"]
    assert res[0]["digests"] != res[2]["digests"]
    # ... equal to what a single reader of that DP rank gets
    for dp_rank in range(2):
        solo = build_loader(shards=str(shard_dir), seed=3, dp_rank=dp_rank, dp_size=2, batch_size=4)
        assert [batch_digest(solo.next_batch()) for _ in range(steps)] == res[2 * dp_rank][
            "digests"
        ]
        # each rank of the group read its share: the two shares add up to a full read
        mine = [
            res[2 * dp_rank]["bytes"][s] + res[2 * dp_rank + 1]["bytes"][s] for s in range(steps)
        ]
        assert sum(mine) == solo.bytes_read
        for r in (2 * dp_rank, 2 * dp_rank + 1):
            assert 0.3 < res[r]["total"] / solo.bytes_read < 0.7  # ~1/2 each (2 of 4 samples)


@pytest.mark.parametrize("mode", [{}, PACKED], ids=["unpacked", "packed"])
def test_prefetch_changes_neither_batches_nor_state(shard_dir, mode):
    kw = {"seed": 9, "batch_size": 2, "num_workers": 2, **mode}
    plain = build_loader(shards=str(shard_dir), **kw)
    ahead = build_loader(shards=str(shard_dir), prefetch=2, **kw)
    for _ in range(3):
        assert batch_digest(ahead.next_batch()) == batch_digest(plain.next_batch())
        assert ahead.state_dict() == plain.state_dict()  # the delivered step, not the prefetched
    state = ahead.state_dict()
    want = [batch_digest(plain.next_batch()) for _ in range(3)]
    ahead.next_batch()  # move on, then restore: prefetched steps are dropped
    ahead.load_state_dict(state)
    assert [batch_digest(ahead.next_batch()) for _ in range(3)] == want
    ahead.close()


def test_state_of_the_old_global_order_is_refused_in_one_line(shard_dir):
    loader = build_loader(shards=str(shard_dir), seed=5, batch_size=2)
    old = {**loader.state_dict(), "version": 1}  # a materialised-permutation era state
    with pytest.raises(LoaderStateError, match="v1: written by an older vfm whose global order"):
        build_loader(shards=str(shard_dir), seed=5, batch_size=2).load_state_dict(old)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"num_workers": -1}, "num_workers=-1 must be >= 0"),
        ({"batch_size": 0}, "batch_size=0 must be >= 1"),
    ],
)
def test_bad_loader_arguments_name_only_the_offending_one(shard_dir, kwargs, message):
    with pytest.raises(ValueError) as e:
        build_loader(shards=str(shard_dir), seed=0, **kwargs)
    assert str(e.value) == message
