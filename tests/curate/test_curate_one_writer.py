"""Two ``vfm curate`` into one DST at once (#46): one curates, the other is refused in one line
naming it, before it reads or removes anything; the manifest is complete and every clip it lists
is there (and no other)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

from tests.curate.conftest import assert_covered
from vfm_core.contracts import AnnotatedClips, read_manifest
from vfm_core.output_lock import LOCK_FILE

REPO = Path(__file__).resolve().parents[2]


def _curate(src: Path, dst: Path, min_len: str) -> subprocess.Popen:
    argv = [sys.executable, "-m", "vfm_core.cli", "curate", str(src), str(dst), "--json"]
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.Popen(
        [*argv, "--min-len", min_len],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_two_curations_into_one_dst_one_is_refused_and_the_output_is_whole(good_dir, tmp_path):
    dst = tmp_path / "out"
    runs = {m: _curate(good_dir[0], dst, m) for m in ("1", "1.5")}  # other settings: other clips
    done = {m: p.communicate(timeout=600) for m, p in runs.items()}
    ends = {m: (runs[m].returncode, *done[m]) for m in runs}
    assert sorted(c for c, _, _ in ends.values()) == [0, 2], ends
    won = next(m for m, (c, _, _) in ends.items() if c == 0)
    lost = next(m for m in ends if m != won)
    err = ends[lost][2]
    assert err.count("\n") == 1, err  # one line
    holder = f"pid {runs[won].pid} on {socket.gethostname()} since "
    assert err.startswith(f"vfm curate: error: DST {dst} is being written by {holder}"), err
    assert f"(python -m vfm_core.cli curate {good_dir[0]} {dst} --json --min-len {won})" in err
    assert err.endswith(": wait for it to end or choose another DST\n")
    summary = json.loads(ends[won][1])
    clips = read_manifest(dst / "clips.parquet", AnnotatedClips)
    assert summary["n_clips"] == clips.height > 0
    listed = {Path(u).name for u in clips["uri"]}
    assert listed == {p.name for p in (dst / "clips").iterdir()}  # each listed clip, no other
    assert_covered(dst)
    assert not (dst / LOCK_FILE).exists() and not (dst / "_pending").exists()
