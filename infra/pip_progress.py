"""``make venv``'s install with progress: pip's output goes whole to a log, a few of its lines to
the terminal, and through pip's silent "Installing collected packages" phase (a minute or more on
a fresh machine) a line every ``--every`` seconds counts the packages already in place.

    python infra/pip_progress.py LOG [--every 10] [--site DIR] -- COMMAND...

Shown from pip: ``Collecting``, ``Installing collected packages`` (cut to its count),
``Successfully installed`` (its count), ``ERROR`` lines. During the install phase: ``installing:
K/N packages in place (T s)``, K the ``*.dist-info`` folders that appeared in ``--site`` (default:
this interpreter's site-packages) since the phase began. Exits with the command's status.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import sysconfig
import threading
import time
from pathlib import Path


def _dist_infos(site: Path) -> set[str]:
    return {p.name for p in site.glob("*.dist-info")} if site.is_dir() else set()


class Ticker:
    """Prints how many of ``total`` packages are in place every ``every`` seconds until stopped."""

    def __init__(self, site: Path, total: int, every: float) -> None:
        self.site, self.total, self.every = site, total, every
        self.before = _dist_infos(site)
        self.t0 = time.monotonic()
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.done.wait(self.every):
            k = len(_dist_infos(self.site) - self.before)
            spent = time.monotonic() - self.t0
            print(f"  installing: {k}/{self.total} packages in place ({spent:.0f} s)", flush=True)

    def stop(self) -> None:
        self.done.set()
        self.thread.join()


INSTALLING = "Installing collected packages:"


def collected(line: str) -> int:
    """How many packages pip's ``Installing collected packages: a, b, ...`` line names."""
    return len([p for p in line.split(":", 1)[1].split(",") if p.strip()])


def shown(line: str) -> str | None:
    """What the terminal shows of one line of pip's output (None: nothing)."""
    if line.startswith(INSTALLING):
        return f"Installing {collected(line)} collected packages"
    if line.startswith("Successfully installed"):
        return f"Successfully installed {len(line.split()) - 2} packages"
    if line.startswith(("Collecting", "ERROR")):
        return line[:100]
    return None


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if "--" not in argv:
        print("usage: pip_progress.py LOG [--every S] [--site DIR] -- COMMAND...", file=sys.stderr)
        return 2
    split = argv.index("--")
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("log")
    ap.add_argument("--every", type=float, default=10.0)
    ap.add_argument("--site", default=sysconfig.get_paths()["purelib"])
    args = ap.parse_args(argv[:split])
    command = argv[split + 1 :]
    ticker = None
    with open(args.log, "w") as log:
        proc = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1
        )
        assert proc.stdout is not None
        for line in proc.stdout:
            log.write(line)
            log.flush()
            line = line.rstrip("\n")
            if line.startswith(INSTALLING):
                ticker = Ticker(Path(args.site), collected(line), args.every)
            elif ticker is not None and not line.startswith(" "):
                ticker.stop()
                ticker = None
            text = shown(line)
            if text is not None:
                print(text, flush=True)
        code = proc.wait()
    if ticker is not None:
        ticker.stop()
    return code


if __name__ == "__main__":
    sys.exit(main())
