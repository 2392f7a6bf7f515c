"""perf.cpu_memory: with the thresholds held, memory a step frees stays mapped, so the next
step's allocations of the same sizes take no page faults (glibc's defaults give the heap's top
back and fault it in again), and the trainer holds them on a CPU device."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from vfm_core.perf import cpu_memory

REPO = Path(__file__).resolve().parents[2]

STEPS = textwrap.dedent(
    """
    import resource, sys
    sys.path.insert(0, {repo!r})
    if {hold}:
        from vfm_core.perf.cpu_memory import hold_freed_memory
        assert hold_freed_memory()
    faults = lambda: resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for i in range(6):  # a "step": 240 MB of 8 MB blocks written, then all freed
        if i == 2:
            first = faults()
        blocks = [bytearray(8 << 20) for _ in range(30)]
        del blocks
    print(faults() - first)
    """
)


def _faults(hold: bool) -> int:
    code = STEPS.format(repo=str(REPO), hold=hold)
    env = {k: v for k, v in os.environ.items() if k not in cpu_memory.USER_SETTINGS}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env
    )
    return int(out.stdout)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_held_memory_takes_no_page_faults_on_the_next_steps():
    assert _faults(hold=False) > 10_000  # the defaults: ~60 thousand faults a step here
    assert _faults(hold=True) < 100


def test_the_kept_memory_is_a_budget_per_machine():
    """Ranks on one machine share the budget: 4 FSDP ranks keep what one process would."""
    gib = 2**30
    assert cpu_memory.trim_budget(64 * gib, 1) == cpu_memory.MAX_TRIM  # 2 GiB
    assert cpu_memory.trim_budget(24 * gib, 1) == 24 * gib // 16  # 1.5 GiB
    assert cpu_memory.trim_budget(24 * gib, 4) == 24 * gib // 16 // 4  # 384 MiB each
    assert cpu_memory.trim_budget(8 * gib, 2) * 2 <= 8 * gib // 16


def test_a_users_own_malloc_settings_stand(monkeypatch):
    monkeypatch.setattr(cpu_memory, "_held", None)
    monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", "1000000")
    monkeypatch.setattr(cpu_memory, "_mallopt", lambda *_: pytest.fail("mallopt called"))
    assert cpu_memory.hold_freed_memory() is False


def test_off_glibc_it_is_a_no_op(monkeypatch):
    monkeypatch.setattr(cpu_memory.sys, "platform", "darwin")
    assert cpu_memory._mallopt(cpu_memory.M_TRIM_THRESHOLD, 1) is False


def test_the_trainer_holds_it_on_the_cpu(monkeypatch):
    from vfm_core.config import apply_overrides
    from vfm_core.recipes import get_recipe
    from vfm_core.train import trainer

    calls = []
    monkeypatch.setattr(trainer, "hold_freed_memory", lambda: calls.append(1) or True)
    cfg = apply_overrides(
        get_recipe("dit-tiny"), ["tracking.mlflow=false", "train.device=cpu", "model.depth=1"]
    )
    trainer.Trainer(cfg)
    assert calls == [1]
