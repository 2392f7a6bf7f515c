"""`LocalExecutor` on threads: the same items as one after another, work side by side, deepest
work first, a stage's failure ends the run with nothing new started."""

from __future__ import annotations

import threading
import time
from collections import Counter

import pytest

from vfm_core.curate.executors import LocalExecutor, share_cpus
from vfm_core.openmp import usable_cpus


class Fan:
    """A stage: item x -> `fan` items (x, k); records when each call starts."""

    def __init__(self, name: str, fan: int, log: list, *, wait: threading.Barrier | None = None):
        self.name, self.fan, self.log, self.wait = name, fan, log, wait
        self.set_up = 0

    def setup(self) -> None:
        self.set_up += 1

    def process(self, batch: list) -> list:
        (x,) = batch
        self.log.append((self.name, x))
        if self.wait is not None:
            self.wait.wait(timeout=10)  # both workers inside at once, or BrokenBarrierError
        time.sleep(0.002)
        return [(x, k) for k in range(self.fan)]


def _stages(log, **kw):
    return [Fan("split", 3, log, **kw), Fan("transcode", 1, log), Fan("annotate", 1, log)]


@pytest.mark.parametrize("workers", [1, 2, 3])
def test_threads_give_the_items_of_one_thread(workers):
    serial = Counter(LocalExecutor(workers=1).run(_stages([]), range(5)))
    log: list = []
    stages = _stages(log)
    out = Counter(LocalExecutor(workers=workers).run(stages, range(5)))
    assert out == serial and sum(out.values()) == 15
    assert all(s.set_up == 1 for s in stages)
    # deepest work first: a new video starts only when no started one has work waiting, so
    # at most `workers` videos are in flight at once
    firsts = [i for i, (name, _) in enumerate(log) if name == "split"]
    for v, at in enumerate(firsts):
        started = {x for name, x in log[:at] if name == "split"}
        finished = {x[0][0] for name, x in log[:at] if name == "annotate"}
        assert len(started - finished) <= workers - 1 or v == 0, (v, log[:at])


def test_items_run_side_by_side():
    both = threading.Barrier(2)
    out = list(LocalExecutor(workers=2).run(_stages([], wait=both), range(2)))
    assert len(out) == 6 and not both.broken  # each split waited for the other one


class Boom(RuntimeError):
    pass


def test_a_stage_failure_ends_the_run_and_starts_nothing_new():
    log: list = []

    class Fails(Fan):
        def process(self, batch):
            if batch[0] == 1:
                raise Boom("stage bug")
            return super().process(batch)

    stages = [Fails("split", 2, log), Fan("transcode", 1, log)]
    with pytest.raises(Boom, match="stage bug"):
        list(LocalExecutor(workers=2).run(stages, range(50)))
    assert len({x for name, x in log if name == "split"}) < 10  # the other 40+ never started


def test_workers_below_one_is_an_error():
    with pytest.raises(ValueError, match=r"LocalExecutor.workers: expected >= 1 or None, got 0"):
        LocalExecutor(workers=0)


def test_side_by_side_jobs_share_the_cpus():
    n = usable_cpus()
    assert share_cpus(1) == n and share_cpus(n) == 1 and share_cpus(10 * n) == 1
    assert share_cpus(0) == n and all(k * share_cpus(k) <= n for k in range(1, n + 1))
