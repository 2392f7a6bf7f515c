"""The README's demo figures, measured: a fresh clone of this commit, its install and both demos,
stage by stage, with the load average as each starts.

    python3 benchmarks/demo_time.py [--repo .] [--families diffusion autoregressive]
        [--clone-to DIR] [--json FILE]

Clones the repository's HEAD (committed work only) into a new folder, runs ``make venv`` there
(the install, timed; pip's cache as this machine has it), then ``make demo`` for each family
(``FAMILY=autoregressive`` for the other), each in the clone's own ``data/`` with no tracking
server of a developer's ``make up`` (``MLFLOW_TRACKING_URI`` and ``VFM_INFRA_DIR`` unset). Each
pipeline writes ``stage_times.json`` (``flows/pipeline.py``: wall seconds per stage, the load
average as it started); printed as one table, stages as rows, families as columns, with the
install, each demo's own wall time ("demo done in N s") and the command's. On this 2-core
machine, idle: ~20 minutes. A busy machine makes every figure longer: the loads are printed so
that a reader can tell.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

WORK = {"diffusion": "demo", "autoregressive": "demo-ar"}
"""Family -> the demo pipeline's folder under data/pipeline/."""


def _load() -> float:
    return os.getloadavg()[0]


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VFM_", "PREFECT_"))}
    for k in ("MLFLOW_TRACKING_URI", "MLFLOW_RUN_ID", "VIRTUAL_ENV"):
        env.pop(k, None)
    return env


def _make(clone: Path, *args: str, log: Path) -> tuple[float, float, str]:
    """(seconds, load at the start, output) of ``make ARGS`` in the clone; a failure names the
    target and the log's last lines."""
    load, t0 = _load(), time.perf_counter()
    with log.open("w") as f:
        proc = subprocess.run(
            ["make", *args], cwd=clone, env=_env(), stdout=f, stderr=subprocess.STDOUT, text=True
        )
    seconds = time.perf_counter() - t0
    out = log.read_text()
    if proc.returncode != 0:
        tail = "\n".join(out.strip().splitlines()[-15:])
        raise SystemExit(f"make {' '.join(args)} failed (exit {proc.returncode}):\n{tail}")
    return seconds, load, out


def measure(repo: Path, families: list[str], clone: Path) -> dict:
    subprocess.run(["git", "clone", "-q", str(repo), str(clone)], check=True)
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=clone, capture_output=True, text=True
    ).stdout.strip()
    print(f"fresh clone of {commit} in {clone}", flush=True)
    install_s, install_load, _ = _make(clone, "venv", log=clone / "install-time.log")
    print(f"install: {install_s:.0f} s (load {install_load:.1f} at the start)", flush=True)
    demos = {}
    for fam in families:
        args = ["demo"] if fam == "diffusion" else ["demo", f"FAMILY={fam}"]
        seconds, load, out = _make(clone, *args, log=clone / f"demo-{fam}.log")
        said = re.search(r"demo done in (\d+) s", out)
        times = json.loads(
            (clone / "data" / "pipeline" / WORK[fam] / "stage_times.json").read_text()
        )
        demos[fam] = {
            "make_seconds": seconds,
            "demo_seconds": float(said.group(1)) if said else None,
            "load_at_start": load,
            "stages": times,
        }
        print(f"{fam}: make demo {seconds:.0f} s (load {load:.1f} at the start)", flush=True)
    return {
        "commit": commit,
        "cpus": os.cpu_count(),
        "install": {"seconds": install_s, "load_at_start": install_load},
        "demos": demos,
    }


def table(rep: dict) -> str:
    fams = list(rep["demos"])
    head = "| stage | " + " | ".join(f"{f} s (load at start)" for f in fams) + " |"
    lines = [head, "|---" * (len(fams) + 1) + "|"]
    names: list[str] = []
    for d in rep["demos"].values():
        names += [n for n in d["stages"] if n not in names]

    def cell(fam: str, name: str) -> str:
        t = rep["demos"][fam]["stages"].get(name)
        if t is None:
            return "-"
        if t["cached"]:
            return "reused"
        load = t.get("load_at_start")
        return f"{t['seconds']:.0f}" + (f" ({load:.1f})" if load is not None else "")

    for name in names:
        lines.append(f"| {name} | " + " | ".join(cell(f, name) for f in fams) + " |")
    demo = " | ".join(f"{rep['demos'][f]['demo_seconds']:.0f}" for f in fams)
    make = " | ".join(
        f"{rep['demos'][f]['make_seconds']:.0f} ({rep['demos'][f]['load_at_start']:.1f})"
        for f in fams
    )
    lines.append(f'| the demo\'s own wall time ("demo done in") | {demo} |')
    lines.append(f"| `make demo`, start to end | {make} |")
    inst = rep["install"]
    lines.append(
        f"\ninstall (`make venv` in the fresh clone): {inst['seconds']:.0f} s, load "
        f"{inst['load_at_start']:.1f} at the start; commit {rep['commit']}, {rep['cpus']} CPUs"
    )
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repo", default=str(Path(__file__).resolve().parents[1]))
    ap.add_argument(
        "--families", nargs="+", default=list(WORK), choices=list(WORK), help="demos to run"
    )
    ap.add_argument("--clone-to", default="", help="an empty or new folder (default: a temp dir)")
    ap.add_argument("--json", default="", help="also write the figures to this file")
    args = ap.parse_args()
    if args.clone_to:
        clone = Path(args.clone_to)
        if clone.exists() and any(clone.iterdir()):
            raise SystemExit(f"--clone-to {clone}: not empty (a fresh clone needs an empty folder)")
    else:
        clone = Path(tempfile.mkdtemp(prefix="vfm-demo-time-")) / "vfm"
    rep = measure(Path(args.repo), args.families, clone)
    print()
    print(table(rep))
    if args.json:
        Path(args.json).write_text(json.dumps(rep, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
