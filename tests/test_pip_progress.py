"""``make venv``'s install progress (infra/pip_progress.py): pip's whole output in the log, a few
of its lines on the terminal, and through the silent install phase a count of the packages
already in place; the command's exit status is kept."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

FAKE_PIP = """
import sys, time
from pathlib import Path
site = Path(sys.argv[1])
print("Collecting torch==2.13.0", flush=True)
print("  Using cached torch-2.13.0.whl", flush=True)
print("Installing collected packages: a, b, c", flush=True)
for name in "abc":
    time.sleep(0.25)
    (site / f"{name}-1.0.dist-info").mkdir()
time.sleep(1.0)  # several ticks after the last package
print("Successfully installed a-1.0 b-1.0 c-1.0", flush=True)
sys.exit(int(sys.argv[2]))
"""


def _run(tmp_path: Path, code: int) -> tuple[subprocess.CompletedProcess, str]:
    site, log = tmp_path / "site", tmp_path / "install.log"
    site.mkdir(exist_ok=True)
    argv = [sys.executable, str(REPO / "infra" / "pip_progress.py"), str(log), "--every", "0.2"]
    argv += ["--site", str(site), "--", sys.executable, "-c", FAKE_PIP, str(site), str(code)]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    return proc, log.read_text()


def test_the_install_phase_counts_packages_in_place_and_the_log_keeps_everything(tmp_path):
    proc, log = _run(tmp_path, 0)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == "Collecting torch==2.13.0" and lines[1] == "Installing 3 collected packages"
    ticks = [ln for ln in lines if ln.startswith("  installing: ")]
    assert ticks and ticks[-1].startswith("  installing: 3/3 packages in place"), lines
    assert lines[-1] == "Successfully installed 3 packages"
    assert "  Using cached torch-2.13.0.whl" in log
    assert "Installing collected packages: a, b, c" in log


def test_a_failing_install_keeps_its_status(tmp_path):
    proc, _ = _run(tmp_path, 3)
    assert proc.returncode == 3
