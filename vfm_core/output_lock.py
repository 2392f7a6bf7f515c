"""One writer per output folder: an advisory lock every writing entry point takes first.

Curation's DST, a shard folder, a training run's ``--out`` and a tokenizer's ``--out`` are each
written by one process at a time. :func:`output_lock` takes ``fcntl.flock(LOCK_EX | LOCK_NB)`` on
``FOLDER/.vfm-writer.lock`` and records its holder there as JSON (pid, host, start time, command):

* held by another process: :class:`OutputLockedError`, one line naming the folder and the holder,
  raised before the second writer writes anything;
* a record left behind by a holder that died (the kernel dropped its flock; a clean release
  removes the record): taken over with a :class:`StaleOutputLockWarning` naming the dead holder;
* held by this process already (a flow holding it calls the library, which takes it too):
  re-entered;
* held by the launcher of this process (``vfm train --nproc N`` holds it while its ranks run):
  the launcher names the folder in ``$VFM_OUTPUT_LOCKS`` (:func:`lock_env`) and the ranks take
  nothing;
* a remote output (``s3://``) has no flock: not locked.

Released when the block ends: the record removed while still locked, then the file closed (flock
goes with it, also when the process dies). A folder the writer made (``new``) that is empty at the
end is removed too, so a run that fails before its first write leaves nothing behind. The folder
must be on a filesystem whose flock is seen by every host that writes it (local disks; NFSv4,
Lustre mounted with ``flock``).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import shlex
import socket
import sys
import threading
import time
import warnings
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

from vfm_core.errors import UserError
from vfm_core.infra_env import pid_alive

LOCK_FILE = ".vfm-writer.lock"
"""The lock file's name inside the output folder."""
LOCKS_ENV = "VFM_OUTPUT_LOCKS"
"""Folders (absolute, ``os.pathsep``-separated) a launcher holds for the processes it starts."""

_held: dict[str, int] = {}  # folder -> depth, the locks this process holds
_guard = threading.Lock()


class OutputLockedError(UserError, RuntimeError):
    """Another process is writing the output folder."""


class OutputLockError(UserError, OSError):
    """The output folder cannot hold a lock file (cannot be created, or not writable)."""


class StaleOutputLockWarning(UserWarning):
    """The lock of a writer that died was taken over."""


def command_line() -> str:
    """This process's command as a user would type it, on one line: ``vfm curate SRC DST``,
    ``python -m vfm_core.train.main ...``, ``pytest ...`` (shortened to 300 characters)."""
    argv = list(getattr(sys, "orig_argv", None) or [sys.executable, *sys.argv])
    words = ["python"]
    for i, arg in enumerate(argv[1:], 1):
        if arg in ("-m", "-c"):  # python -m MODULE ...
            words = ["python", *argv[i:]]
            break
        if not arg.startswith("-"):  # a script: vfm, pytest, prefect
            words = [Path(arg).name, *argv[i + 1 :]]
            break
    text = " ".join(shlex.join(words).split())  # one line, also for python -c CODE
    return text if len(text) <= 300 else text[:297] + "..."


def _describe(record: dict) -> str:
    """``pid N on HOST since TIME (COMMAND)`` of a lock record (its missing fields as ?)."""
    return (
        f"pid {record.get('pid', '?')} on {record.get('host', '?')} since "
        f"{record.get('since', '?')} ({record.get('command', '?')})"
    )


def _read_record(path: Path) -> dict | None:
    """The holder recorded in ``path``, or None when it is missing, empty or not a record."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and data else None


def _open_locked(path: Path, what: str, folder: Path) -> int | None:
    """A descriptor of ``path`` holding its flock, or None when another process holds it. A
    releasing holder unlinks the file while locked: the file locked must still be the one at
    ``path``, else it is opened again."""
    for _ in range(100):
        try:
            folder.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except FileNotFoundError:  # the folder removed by a writer that made it and failed
            continue
        except OSError as e:
            raise OutputLockError(
                f"{what} {folder}: cannot create its writer lock {path.name} ({e.strerror})"
            ) from e
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            os.close(fd)
            if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                return None
            raise OutputLockError(
                f"{what} {folder}: cannot lock {path.name} ({e.strerror}; the filesystem needs "
                "flock)"
            ) from e
        try:
            here = os.stat(path)
        except FileNotFoundError:
            here = None
        st = os.fstat(fd)
        if here is not None and (here.st_ino, here.st_dev) == (st.st_ino, st.st_dev):
            return fd
        os.close(fd)  # locked a file its holder had just removed: take the one there now
    raise OutputLockError(f"{what} {folder}: its writer lock {path.name} keeps changing")


def _refusal(path: Path, what: str, folder: Path) -> OutputLockedError:
    """The one-line refusal naming the holder (its record read again for a moment: a holder
    writes it just after it locked)."""
    record = None
    for _ in range(20):
        if (record := _read_record(path)) is not None:
            break
        time.sleep(0.05)
    holder = _describe(record) if record else "another process (its record is not readable)"
    return OutputLockedError(
        f"{what} {folder} is being written by {holder}: wait for it to end or choose another {what}"
    )


def _take_over(fd: int, what: str, folder: Path) -> None:
    """A record already in the file just locked is a holder that died without releasing:
    warn naming it."""
    try:
        old = json.loads(os.pread(fd, 1 << 16, 0) or b"{}")
    except ValueError:
        old = {"command": "an unreadable record"}
    if not isinstance(old, dict):
        old = {"command": "an unreadable record"}
    if not old:
        return
    if old.get("host") == socket.gethostname() and not pid_alive(old.get("pid")):
        gone = f"pid {old.get('pid')} is not running"
    else:
        gone = "it no longer holds the lock"
    warnings.warn(
        f"{what} {folder}: taking over the writer lock of {_describe(old)}, which ended without "
        f"releasing it ({gone})",
        StaleOutputLockWarning,
        stacklevel=2,
    )


def _inherited(key: str) -> bool:
    return key in os.environ.get(LOCKS_ENV, "").split(os.pathsep)


def lock_env(folder: str | Path, env: dict[str, str] | None = None) -> dict[str, str]:
    """``env`` (None: this process's environment) with ``folder`` added to the folders the
    processes started with it find locked by their launcher (:data:`LOCKS_ENV`)."""
    out = dict(os.environ if env is None else env)
    held = [p for p in out.get(LOCKS_ENV, "").split(os.pathsep) if p]
    key = str(Path(folder).resolve())
    out[LOCKS_ENV] = os.pathsep.join([*held, key] if key not in held else held)
    return out


@contextlib.contextmanager
def output_lock(
    folder: str | Path, *, what: str = "output", new: bool | None = None
) -> Iterator[None]:
    """Hold the writer lock of ``folder`` for the block (module docstring); made when missing.
    ``what`` names the folder in messages (``DST``, ``--out``); ``new``: the folder did not exist
    before this writer (None: whether it exists now), removed at the end when left empty."""
    if "://" in str(folder):  # a remote prefix: no flock there
        yield
        return
    path_folder = Path(folder).resolve()
    key = str(path_folder)
    if _inherited(key):
        yield
        return
    with _guard:
        if key in _held:
            _held[key] += 1
            reentered = True
        else:
            reentered = False
    if reentered:
        try:
            yield
        finally:
            with _guard:
                _held[key] -= 1
        return
    if new is None:
        new = not path_folder.exists()
    path = path_folder / LOCK_FILE
    fd = _open_locked(path, what, path_folder)
    if fd is None:
        raise _refusal(path, what, path_folder)
    try:
        _take_over(fd, what, path_folder)
        record = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "since": datetime.now().astimezone().isoformat(timespec="seconds"),
            "command": command_line(),
        }
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(record).encode(), 0)
        with _guard:
            _held[key] = 1
        try:
            yield
        finally:
            with _guard:
                del _held[key]
    finally:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()  # still locked: a waiting writer that opened it opens anew
        os.close(fd)
        if new:
            with contextlib.suppress(OSError):
                path_folder.rmdir()  # only when empty: nothing was written


__all__ = [
    "LOCKS_ENV",
    "LOCK_FILE",
    "OutputLockError",
    "OutputLockedError",
    "StaleOutputLockWarning",
    "command_line",
    "lock_env",
    "output_lock",
]
