"""Checkpoints through torch.distributed.checkpoint (DCP): tensors in safetensors, the rest in
JSON, loadable under any other parallel layout, each verified by a manifest written last.

Layout of ``DIR/checkpoints/step_00000010/``:

* ``*.safetensors`` + ``model.safetensors.index.json``: every tensor of the Stateful state
  (model, EMA, optimizer moments), written by DCP's HuggingFace storage writer. Every rank writes
  its own shards at once (``save_distributed``; replicated tensors are de-duplicated), and
  loading reads them into the *current* layout's shards, so a checkpoint saved under TP2 loads
  under FSDP2, TP2 x CP2, PP2 or one process (paper §4: resharding);
* ``state.json``: the non-tensor leaves (step, loader position, LR-schedule counters, MLflow run
  id), the model config (to refuse a resume of another model shape) and the union of every
  rank's state skeleton (:mod:`vfm_core.checkpoints.state_tree`; ranks may hold different
  tensors under pipeline parallelism). Each rank loads the subset of the saved tensors its own
  state holds;
* ``manifest.json``: size and sha256 of every file above (:mod:`vfm_core.checkpoints.integrity`).

A save, in order: every rank writes its tensors into ``step_N.tmp`` → rank 0 writes
``state.json`` → rank 0 hashes the files and writes the manifest (fsynced) → renames the folder
to ``step_N`` → checks the new checkpoint against its manifest → only then retires checkpoints
beyond ``keep`` (renamed to ``.del`` first, so a half-deleted one is never listed). A crash at any
point leaves the previous checkpoints intact and loadable. A save that fails to write (a full disk,
a lost mount) removes its ``step_N.tmp`` and raises :class:`CheckpointError` with the bytes it
tried to write and the space free there.

Asynchronous saves (``train.async_checkpoint``, :meth:`CheckpointManager.save` with
``async_save``): the training step waits only for the staging copy of the tensors to host memory
(DCP ``async_save``); a background thread writes the files over a separate gloo process group
(the trainer's collectives keep the default group to themselves, and async save needs a CPU
backend even when training runs on NCCL), then rank 0 finishes the checkpoint as above. The
manifest is the completion marker: no manifest, no checkpoint. The next save, and the end of the
run, wait for an outstanding one (:meth:`CheckpointManager.wait`).

Resuming (:meth:`CheckpointManager.choose`): rank 0 verifies checkpoints newest first, prints one
warning line per damaged one (which checkpoint, which file, why) and every rank loads the newest
intact one, or the one named by ``--resume-from``.

No pickle: DCP's default ``.metadata`` file is a pickle, so the safetensors storage is used
instead, and ``state.json`` / ``manifest.json`` are plain JSON. The same code runs with one rank
or without any process group (tests, inference tools).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
import warnings
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import (
    CheckpointException,
    HuggingFaceStorageReader,
    HuggingFaceStorageWriter,
)

from vfm_core.checkpoints.errors import CheckpointError
from vfm_core.checkpoints.failures import (
    byte_size,
    local_bytes,
    mismatch_line,
    os_error_behind,
    problems_line,
)
from vfm_core.checkpoints.integrity import MANIFEST_FILE, verify, write_manifest
from vfm_core.checkpoints.layout import FORMAT_VERSION, STATE_FILE
from vfm_core.checkpoints.state_tree import (
    join_state,
    merge_skeletons,
    restore_int_keys,
    restrict_skeleton,
    split_state,
    split_state_paths,
)
from vfm_core.checkpoints.trainer_state import load_trainer, save_trainer
from vfm_core.parallel.world import all_gather_bytes, barrier, is_rank0

__all__ = [
    "MANIFEST_FILE",
    "STATE_FILE",
    "CheckpointError",
    "CheckpointManager",
    "dcp_error_line",
    "load_trainer",
    "save_trainer",
]

_STEP_DIR = re.compile(r"^step_(\d{8})$")
_LEFTOVER = re.compile(r"^step_\d{8}\.(tmp|del|old)$")


def dcp_error_line(error: BaseException) -> str:
    """One line for an error of a DCP load: a rank's own error (``Size mismatch between saved
    torch.Size([3, 3]) and current ...``) rather than DCP's CheckpointException, whose text is
    every rank's traceback."""
    if isinstance(error, CheckpointException) and error.failures:
        error = next(iter(error.failures.values()))[0]
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def _from_rank0(obj: Any) -> Any:
    """Rank 0's JSON-serialisable ``obj`` on every rank (itself without a process group)."""
    return json.loads(all_gather_bytes(json.dumps(obj).encode() if is_rank0() else b"")[0])


FILE_BYTES = 512 * 2**20
"""Tensors of one rank per safetensors file, at most (one larger tensor gets a file alone): the
writer serialises a whole file in memory before writing it, so this bounds the extra memory of
a save (one file for everything had doubled a rank's resident memory at every save)."""


def file_index(tensors: dict[str, torch.Tensor]) -> dict[str, int]:
    """Every tensor key of every rank -> its file (1..n), the same on every rank: keys in sorted
    order, a new file once the global bytes so far would pass :data:`FILE_BYTES` times the
    world size (a sharded tensor's rank holds about 1/world of it)."""
    sizes = {k: _global_bytes(t) for k, t in tensors.items()}
    merged: dict[str, int] = {}
    for raw in all_gather_bytes(json.dumps(sizes).encode()):  # ranks may hold other keys (PP)
        merged.update(json.loads(raw))
    world = dist.get_world_size() if dist.is_initialized() else 1
    limit, index, used, out = FILE_BYTES * world, 1, 0, {}
    for key in sorted(merged):
        if used and used + merged[key] > limit:
            index, used = index + 1, 0
        out[key] = index
        used += merged[key]
    return out


def _global_bytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()  # a DTensor's numel is its global size


class CheckpointManager:
    """Saves and restores a Stateful state dict under ``root/checkpoints`` on every rank of the
    default process group (or alone); keeps the last ``keep``; ``async_save`` writes in the
    background (module docstring)."""

    def __init__(self, root: str | Path, *, keep: int = 2, async_save: bool = False):
        self.dir = Path(root) / "checkpoints"
        self.keep = keep
        self.async_save = async_save
        self._pending: Future | None = None
        self._pending_step = 0
        self._executor: ThreadPoolExecutor | None = None
        self._group: Any = None
        self.written: Path | None = None
        """The checkpoint this manager saved last (finished: an asynchronous one after
        :meth:`wait`); None before the first save. Not :meth:`latest`: a resumed run may leave a
        newer checkpoint of an earlier attempt beside the ones it writes."""

    def path(self, step: int) -> Path:
        return self.dir / f"step_{step:08d}"

    def candidates(self) -> list[Path]:
        """Every ``step_N`` folder, oldest first, complete or not (no ``.tmp`` leftovers)."""
        if not self.dir.exists():
            return []
        return sorted(p for p in self.dir.iterdir() if _STEP_DIR.match(p.name) and p.is_dir())

    def leftovers(self) -> list[Path]:
        """Folders of saves that never finished (``step_N.tmp``: killed while writing) or of
        removals that stopped halfway (``.del`` / ``.old``), oldest first."""
        if not self.dir.exists():
            return []
        return sorted(p for p in self.dir.iterdir() if _LEFTOVER.match(p.name))

    def remove_leftovers(self) -> list[Path]:
        """Remove :meth:`leftovers` (call on one rank, before this run saves); returns them."""
        gone = self.leftovers()
        for p in gone:
            shutil.rmtree(p, ignore_errors=True)
        return gone

    def list(self) -> list[Path]:
        """Finished checkpoints (a manifest written), oldest first; not verified."""
        return [p for p in self.candidates() if (p / MANIFEST_FILE).is_file()]

    def latest(self) -> Path | None:
        done = self.list()
        return done[-1] if done else None

    # ------------------------------------------------------------------ save
    def save(
        self,
        step: int,
        state: dict[str, Any],
        *,
        meta: dict[str, Any],
        async_save: bool | None = None,
    ) -> Path:
        """Save ``state`` as step ``step`` on every rank; returns the final folder (which exists
        once the save finished: now, or after :meth:`wait` for an asynchronous save)."""
        self.wait()  # one save in flight at a time
        use_async = self.async_save if async_save is None else async_save
        final = self.path(step)
        tmp = final.with_name(final.name + ".tmp")
        if is_rank0():
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)
        barrier()
        tensors, skeleton = split_state(state)
        tensors = {k: v.detach() for k, v in tensors.items()}
        nbytes = sum(local_bytes(t) for t in tensors.values())
        skeletons = [json.loads(b) for b in all_gather_bytes(json.dumps(skeleton).encode())]
        doc = (
            {
                "format": FORMAT_VERSION,
                "step": step,
                "meta": meta,
                "state": merge_skeletons(skeletons),
            }
            if is_rank0()
            else None
        )
        files = file_index(tensors)
        writer = HuggingFaceStorageWriter(
            str(tmp), save_distributed=True, fqn_to_index_mapping=files
        )
        with warnings.catch_warnings():  # one process: DCP notes it runs without a process group
            warnings.simplefilter("ignore", UserWarning)
            if use_async:  # returns once the tensors are staged (copied) to host memory
                future = dcp.async_save(
                    tensors, storage_writer=writer, process_group=self._checkpoint_group()
                )
                self._pending_step = step
                self._pending = self._pool().submit(self._complete, future, tmp, final, doc, nbytes)
                return final
            try:
                dcp.save(tensors, storage_writer=writer)
            except (Exception, CheckpointException) as e:  # DCP raises on every rank
                raise self._write_failed(step, tmp, nbytes, e) from e
        barrier()
        outcome: dict[str, str] = {}
        if doc is not None:
            try:
                self._finish(tmp, final, doc)
            except CheckpointError as e:
                outcome["error"] = str(e)
            except OSError as e:
                outcome["error"] = str(self._write_failed(step, tmp, nbytes, e))
        outcome = _from_rank0(outcome)  # every rank learns how rank 0 finished
        if "error" in outcome:
            raise CheckpointError(outcome["error"])
        self.written = final
        return final

    def _write_failed(
        self, step: int, tmp: Path, nbytes: int, error: BaseException
    ) -> CheckpointError:
        """A save that could not write: rank 0 removes the partial ``tmp``; the one line names
        the OS error, the bytes the save tried to write and the space then free there. An error
        that is not the file system's is a bug and propagates as it is."""
        if is_rank0():
            shutil.rmtree(tmp, ignore_errors=True)
        cause = os_error_behind(error)
        if cause is None:
            raise error
        why = cause.strerror or (os.strerror(cause.errno) if cause.errno else str(cause))
        try:
            free = f"{byte_size(shutil.disk_usage(self.dir).free)} free there after removing it"
        except OSError:
            free = "the free space there unknown"
        share = (
            " (this rank's share)" if dist.is_initialized() and dist.get_world_size() > 1 else ""
        )
        return CheckpointError(
            f"checkpoint of step {step}: writing {tmp} failed ({why}): it tried to write "
            f"{byte_size(nbytes)} of tensors{share}, {free}; the previous checkpoints under "
            f"{self.dir} are intact"
        )

    def _checkpoint_group(self) -> Any:
        """The gloo group of the background writes (created once, by every rank together)."""
        if self._group is None and dist.is_initialized():
            self._group = dist.new_group(backend="gloo")
        return self._group

    def _pool(self) -> ThreadPoolExecutor:
        if self._executor is None:
            self._executor = ThreadPoolExecutor(1, thread_name_prefix="vfm-checkpoint")
        return self._executor

    def _complete(self, future: Any, tmp: Path, final: Path, doc: dict | None, nbytes: int) -> None:
        """Background thread: wait for DCP's writes (on rank 0 its future completes once every
        rank's files are written), then rank 0 finishes the checkpoint."""
        try:
            future.result()
            if doc is not None:
                self._finish(tmp, final, doc)
        except CheckpointError:
            raise
        except (Exception, CheckpointException) as e:
            raise self._write_failed(self._pending_step, tmp, nbytes, e) from e

    def _finish(self, tmp: Path, final: Path, doc: dict) -> None:
        """Rank 0, every rank's tensors written: state.json, the manifest (last), the rename, a
        check of the new checkpoint, then retention."""
        (tmp / STATE_FILE).write_text(json.dumps(doc, indent=1))
        write_manifest(tmp, step=doc["step"])
        old = final.with_name(final.name + ".old")
        if final.exists():  # the same step saved again (a resumed run): replace it
            shutil.rmtree(old, ignore_errors=True)
            final.rename(old)
        tmp.rename(final)
        shutil.rmtree(old, ignore_errors=True)
        problems = verify(final, hashes=False)  # the hashes were just taken from these files
        if problems:
            raise CheckpointError(f"{problems[0]} right after saving; kept every older checkpoint")
        self._retire(final)

    def _retire(self, newest: Path) -> None:
        """Keep ``newest`` and the ``keep - 1`` finished checkpoints before it; remove older
        ones and leftovers of interrupted saves. Checkpoints after ``newest`` stay."""
        if self.keep <= 0:
            return
        older = [p for p in self.candidates() if p.name < newest.name]
        finished = [p for p in older if (p / MANIFEST_FILE).is_file()]
        kept = set(finished[len(finished) - (self.keep - 1) :]) if self.keep > 1 else set()
        for p in older:
            if p not in kept:
                gone = p.with_name(p.name + ".del")  # never listed, even if removal stops halfway
                p.rename(gone)
                shutil.rmtree(gone, ignore_errors=True)
        for p in self.dir.iterdir():
            if _LEFTOVER.match(p.name) and p.name.split(".")[0] < newest.name:
                shutil.rmtree(p, ignore_errors=True)

    def wait(self) -> None:
        """Wait for an outstanding asynchronous save to be finished on every rank; a failed one
        raises :class:`CheckpointError` on every rank."""
        if self._pending is None:
            return
        pending, self._pending = self._pending, None
        err = ""
        try:
            pending.result()
        except CheckpointError as e:  # a failed write, already one line
            err = f"asynchronous {e}"
        except (Exception, CheckpointException) as e:  # reported to the user in one line
            first = str(e).strip().splitlines()[0] if str(e).strip() else ""
            err = (
                f"asynchronous checkpoint of step {self._pending_step} failed "
                f"({type(e).__name__}: {first}); the previous checkpoints under {self.dir} are "
                "intact"
            )
        errors = [b.decode() for b in all_gather_bytes(err.encode()) if b]
        if errors:
            raise CheckpointError(errors[0])
        self.written = self.path(self._pending_step)

    def close(self) -> None:
        """Finish this rank's outstanding save (no collective: safe after an error)."""
        if self._pending is not None:
            try:
                self._pending.result()
            except (Exception, CheckpointException) as e:
                print(
                    f"warning: asynchronous checkpoint of step {self._pending_step} failed: {e}",
                    file=sys.stderr,
                )
            self._pending = None
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None

    # ------------------------------------------------------------------ resume
    def choose(
        self,
        explicit: str | Path | None = None,
        *,
        flag: str = "--resume",
        explicit_flag: str = "--resume-from",
    ) -> Path:
        """The checkpoint to resume (or generate) from, the same on every rank: ``explicit`` when
        intact, else the newest intact one. Rank 0 verifies (sha256 of every file) and prints one
        warning line per damaged checkpoint it skips; no intact one raises
        :class:`CheckpointError`, its message led by ``flag`` / ``explicit_flag`` (the option
        the user gave)."""
        result: dict[str, str] = {}
        if is_rank0():
            if explicit is not None:
                problems = verify(Path(explicit))
                if problems:
                    result["error"] = f"{explicit_flag}: {problems_line(problems)}"
                else:
                    result["path"] = str(explicit)
            else:
                for p in reversed(self.candidates()):
                    problems = verify(p)
                    if not problems:
                        result["path"] = str(p)
                        break
                    print(f"warning: skipping {problems_line(problems)}", file=sys.stderr)
                else:
                    n = len(self.candidates())
                    if n:
                        why = f"all {n} damaged or unfinished, see the warnings above"
                    elif flag == "--resume":
                        why = "nothing to continue; drop --resume to start a new run"
                    else:
                        why = "the run has no finished checkpoint yet"
                    result["error"] = f"{flag}: no valid checkpoint under {self.dir} ({why})"
        result = _from_rank0(result)
        if "error" in result:
            raise CheckpointError(result["error"])
        return Path(result["path"])

    @staticmethod
    def read_meta(path: Path) -> dict[str, Any]:
        try:
            doc = json.loads((path / STATE_FILE).read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            raise CheckpointError(f"checkpoint {path}: {STATE_FILE}: cannot read ({e})") from None
        if not isinstance(doc, dict) or doc.get("format") != FORMAT_VERSION:
            fmt = doc.get("format") if isinstance(doc, dict) else None
            raise CheckpointError(f"checkpoint {path}: {STATE_FILE}: unknown format {fmt!r}")
        return doc

    def load(self, path: Path, template: dict[str, Any]) -> dict[str, Any]:
        """Load into tensors shaped (and sharded) like ``template``, the live state dict (call
        :func:`init_optimizer_state` before taking it); returns this rank's full state."""
        doc = self.read_meta(path)
        tensors, _ = split_state(template)
        skeleton = doc["state"]
        saved_paths = set(split_state_paths(skeleton))
        # all ranks together must hold exactly the saved tensors; each reads its own subset
        everyone: set[str] = set()
        for raw in all_gather_bytes(json.dumps(sorted(tensors)).encode()):
            everyone.update(json.loads(raw))
        missing, extra = everyone - saved_paths, saved_paths - everyone
        if missing or extra:
            raise CheckpointError(mismatch_line(path, missing, extra))
        buffers = {k: torch.empty_like(v) for k, v in tensors.items()}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            try:
                dcp.load(buffers, storage_reader=HuggingFaceStorageReader(str(path)))
            except (Exception, CheckpointException) as e:  # CheckpointException: BaseException
                raise CheckpointError(
                    f"checkpoint {path}: *.safetensors: cannot load the tensors "
                    f"({dcp_error_line(e)})"
                ) from e
        mine = restrict_skeleton(skeleton, set(tensors))
        return restore_int_keys(join_state(mine, buffers), template)
