"""Checkpoint integrity: a manifest of every file's size and sha256, written last.

A checkpoint folder is a checkpoint only when it holds a complete ``manifest.json``::

    {"format": "vfm-checkpoint-manifest", "version": 1, "step": 10,
     "files": {"state.json": {"bytes": 5120, "sha256": "..."}, ...}}

The manifest is the completion marker of a save: the checkpoint manager writes it after every
rank's tensors and ``state.json`` are on disk (after DCP's future completed, for asynchronous
saves), fsyncs it and only then renames ``step_N.tmp`` to ``step_N``. A crash at any point before
leaves either a ``.tmp`` folder (never listed) or a folder without a manifest (never loaded).

:func:`verify` checks a folder against its manifest: every listed file present with its size
and sha256 and readable as what its name says (a safetensors header, JSON: a manifest hashed
again after the files were replaced does not make garbage a checkpoint), no unlisted tensor or
JSON file. A manifest entry must be a plain file name: one that leads out of the folder
(``../x``, ``/etc/x``, ``sub/x``) makes the manifest malformed, and nothing is read. Each problem
is a :class:`Problem`, whose string is the one line the user sees: ``checkpoint DIR: FILE: what
is wrong``. Nothing here unpickles.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from safetensors import SafetensorError, safe_open

__all__ = ["MANIFEST_FILE", "Problem", "file_digest", "read_manifest", "verify", "write_manifest"]

MANIFEST_FILE = "manifest.json"
FORMAT = "vfm-checkpoint-manifest"
VERSION = 1
_CHUNK = 8 << 20
_CHECKED_SUFFIXES = (".safetensors", ".json")
"""Files a loader would read: one of these that the manifest does not list is a problem (other
files, a note beside the tensors, are never opened)."""


@dataclass(frozen=True, slots=True)
class Problem:
    """One thing wrong with a checkpoint: which folder, which file, why."""

    checkpoint: Path
    file: str
    reason: str

    def __str__(self) -> str:
        return f"checkpoint {self.checkpoint}: {self.file}: {self.reason}"


def file_digest(path: Path) -> tuple[int, str]:
    """(size in bytes, sha256 hex) of ``path``, read in 8 MiB chunks."""
    h = hashlib.sha256()
    size = 0
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)  # hashlib releases the GIL on large buffers: threads hash in parallel
            size += len(chunk)
    return size, h.hexdigest()


def _digests(folder: Path, names: list[str]) -> dict[str, tuple[int, str]]:
    with ThreadPoolExecutor(max_workers=max(1, min(4, len(names)))) as pool:
        return dict(zip(names, pool.map(lambda n: file_digest(folder / n), names)))


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_manifest(folder: Path, *, step: int) -> dict:
    """Hash every file of ``folder`` and write ``manifest.json`` (to a temporary name, fsynced,
    renamed: a manifest is complete or absent). Call it last, once every file is written."""
    names = sorted(p.name for p in folder.iterdir() if p.is_file() and p.name != MANIFEST_FILE)
    digests = _digests(folder, names)
    files = {n: {"bytes": size, "sha256": sha} for n, (size, sha) in digests.items()}
    doc = {"format": FORMAT, "version": VERSION, "step": step, "files": files}
    tmp = folder / (MANIFEST_FILE + ".tmp")
    tmp.write_text(json.dumps(doc, indent=1))
    _fsync(tmp)
    os.replace(tmp, folder / MANIFEST_FILE)
    _fsync(folder)
    return doc


def read_manifest(folder: Path) -> tuple[dict | None, Problem | None]:
    """(manifest, None) or (None, the problem with it)."""
    path = folder / MANIFEST_FILE
    if not path.is_file():
        why = "missing (the save did not finish, or the checkpoint predates manifests)"
        return None, Problem(folder, MANIFEST_FILE, why)
    try:
        doc = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        return None, Problem(folder, MANIFEST_FILE, f"not valid JSON ({e})")
    files = doc.get("files") if isinstance(doc, dict) else None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT or not isinstance(files, dict):
        return None, Problem(folder, MANIFEST_FILE, "not a vfm checkpoint manifest")
    if doc.get("version") != VERSION:
        return None, Problem(folder, MANIFEST_FILE, f"unknown version {doc.get('version')!r}")
    step = doc.get("step")
    if not isinstance(step, int) or isinstance(step, bool) or step < 0:
        return None, Problem(folder, MANIFEST_FILE, f"step {step!r} is not a step number")
    named = re.fullmatch(r"step_(\d+)", folder.name)
    if named and int(named.group(1)) != step:  # resume picks the newest folder by its name
        why = f"says step {step}, the folder name step {int(named.group(1))} (renamed or copied)"
        return None, Problem(folder, MANIFEST_FILE, why)
    for name, entry in files.items():
        if name in ("", ".", "..") or name != Path(name).name or "\\" in name or "\0" in name:
            why = f"entry {name!r} is not a file name inside the checkpoint folder"
            return None, Problem(folder, MANIFEST_FILE, why)
        if not (
            isinstance(entry, dict)
            and isinstance(entry.get("bytes"), int)
            and isinstance(entry.get("sha256"), str)
        ):
            return None, Problem(folder, MANIFEST_FILE, f"malformed entry for {name!r}")
    return doc, None


def verify(folder: str | Path, *, hashes: bool = True) -> list[Problem]:
    """Every problem of the checkpoint ``folder`` (empty: intact). ``hashes=False`` checks only
    presence and sizes (no read of the tensors)."""
    folder = Path(folder)
    if not folder.is_dir():
        return [Problem(folder, ".", "no such checkpoint directory")]
    doc, problem = read_manifest(folder)
    if problem is not None:
        return [problem]
    files: dict[str, dict] = doc["files"]
    problems: list[Problem] = []
    present: list[str] = []
    for name, entry in files.items():
        path = folder / name
        if not path.is_file():
            problems.append(Problem(folder, name, "missing"))
            continue
        size = path.stat().st_size
        if size != entry["bytes"]:
            cut = " (truncated)" if size < entry["bytes"] else ""
            problems.append(
                Problem(folder, name, f"{size} bytes, the manifest says {entry['bytes']}{cut}")
            )
            continue
        present.append(name)
    if hashes and present:
        for name, (_, sha) in _digests(folder, present).items():
            if sha != files[name]["sha256"]:
                problems.append(
                    Problem(
                        folder,
                        name,
                        "sha256 differs from the manifest (the file was modified or corrupted)",
                    )
                )
    damaged = {p.file for p in problems}
    for name in present:
        if name not in damaged and (why := _unreadable(folder / name)):
            problems.append(Problem(folder, name, why))
    for p in sorted(folder.iterdir()):
        if p.name not in files and p.name != MANIFEST_FILE and p.suffix in _CHECKED_SUFFIXES:
            problems.append(
                Problem(folder, p.name, "not listed in the manifest (added after the save)")
            )
    return problems


def _unreadable(path: Path) -> str | None:
    """Why ``path`` cannot be read as what its name says (a safetensors header and the tensor
    offsets in it, JSON), or None."""
    try:
        if path.suffix == ".safetensors":
            with safe_open(str(path), framework="numpy"):
                return None
        if path.suffix == ".json":
            json.loads(path.read_bytes())
    except (OSError, ValueError, SafetensorError) as e:  # UnicodeDecodeError is a ValueError
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        return f"not a readable {path.suffix[1:]} file ({first})"
    return None
