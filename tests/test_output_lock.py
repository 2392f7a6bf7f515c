"""One writer per output folder (:mod:`vfm_core.output_lock`), with real second processes: a
holder in another process refuses this one, naming it; a holder that died is taken over with a
warning naming it; a launcher's lock reaches the processes it starts."""

from __future__ import annotations

import fcntl
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from vfm_core.output_lock import (
    LOCK_FILE,
    OutputLockedError,
    StaleOutputLockWarning,
    lock_env,
    output_lock,
)

REPO = Path(__file__).resolve().parents[1]

HOLD = """
import sys
from vfm_core.output_lock import output_lock
with output_lock(sys.argv[1], what="DST"):
    print("held", flush=True)
    sys.stdin.readline()  # until the test closes stdin (or kills this process)
"""

TAKE = """
import sys
from vfm_core.output_lock import OutputLockedError, output_lock
try:
    with output_lock(sys.argv[1], what="DST"):
        print("took it")
except OutputLockedError as e:
    print(f"refused: {e}")
    sys.exit(2)
"""


def _env(env: dict[str, str] | None = None) -> dict[str, str]:
    return dict(os.environ if env is None else env, PYTHONPATH=str(REPO))


def _holder(folder: Path) -> subprocess.Popen:
    """A process holding ``folder``'s lock until its stdin closes."""
    p = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(folder)],
        env=_env(),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert p.stdout is not None and p.stdout.readline() == "held\n"
    return p


def _take(folder: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """Another process taking ``folder``'s lock: "took it", or exit 2 and "refused: ..."."""
    argv = [sys.executable, "-c", TAKE, str(folder)]
    return subprocess.run(argv, env=_env(env), capture_output=True, text=True, timeout=60)


def test_a_second_writer_is_refused_naming_the_holder_and_free_after_it(tmp_path):
    out = tmp_path / "out"
    holder = _holder(out)
    try:
        record = json.loads((out / LOCK_FILE).read_text())
        assert record["pid"] == holder.pid and record["host"] == socket.gethostname()
        assert record["command"].startswith("python -c ")
        with pytest.raises(OutputLockedError) as e:
            with output_lock(out, what="DST"):
                pytest.fail("a second writer got in")
        assert str(e.value) == (
            f"DST {out} is being written by pid {holder.pid} on {socket.gethostname()} since "
            f"{record['since']} ({record['command']}): wait for it to end or choose another DST"
        )
        assert "\n" not in str(e.value)
        assert sorted(p.name for p in out.iterdir()) == [LOCK_FILE]  # the refused wrote nothing
        # another process too; one its launcher told that the lock is held for it passes
        refused = _take(out)
        assert refused.returncode == 2 and f"by pid {holder.pid} on" in refused.stdout
        assert _take(out, env=lock_env(out)).stdout == "took it\n"
    finally:
        holder.communicate("")  # released: stdin closed, the block ends
    assert holder.returncode == 0 and not out.exists()  # made by it and left empty: removed
    with output_lock(out, what="DST"):  # free again; re-entered by the same process
        (out / "a").write_text("x")
        with output_lock(out, what="DST"):
            pass
        assert (out / LOCK_FILE).exists()
    assert sorted(p.name for p in out.iterdir()) == ["a"]


def test_the_record_of_a_dead_holder_is_taken_over_with_a_warning(tmp_path):
    out = tmp_path / "out"
    holder = _holder(out)
    holder.send_signal(signal.SIGKILL)  # dies holding it: no release, its record stays
    holder.wait()
    holder.stdout.close()
    left = json.loads((out / LOCK_FILE).read_text())
    assert left["pid"] == holder.pid
    with pytest.warns(StaleOutputLockWarning) as caught:
        with output_lock(out, what="--out"):
            mine = json.loads((out / LOCK_FILE).read_text())
            assert mine["pid"] == os.getpid()
            assert _take(out).returncode == 2  # held again, by this process now
    assert [str(w.message) for w in caught] == [
        f"--out {out}: taking over the writer lock of pid {holder.pid} on "
        f"{socket.gethostname()} since {left['since']} ({left['command']}), which ended "
        f"without releasing it (pid {holder.pid} is not running)"
    ]
    assert not (out / LOCK_FILE).exists()


def test_a_refusal_while_the_holder_writes_its_record_still_names_it(tmp_path):
    """A lock taken and its record not yet written: the refusal waits a moment for it."""
    out = tmp_path / "out"
    out.mkdir()
    (out / LOCK_FILE).write_text("")
    fd = os.open(out / LOCK_FILE, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        t0 = time.monotonic()
        with pytest.raises(OutputLockedError, match=r"by another process \(its record"):
            with output_lock(out):
                pass
        assert time.monotonic() - t0 < 5
    finally:
        os.close(fd)
