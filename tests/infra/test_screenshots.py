"""The screenshot tool's contract without a browser (CI has none; the PNGs in docs/screenshots
were taken with ``python infra/screenshots.py`` and a system chromium)."""

from __future__ import annotations

from infra.screenshots import main


def test_without_chromium_it_says_what_to_install(tmp_path, capsys):
    assert main(["--chromium", "no-such-browser-here", "--out", str(tmp_path)]) == 1
    assert "no-such-browser-here: not found (apt-get install chromium)" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []  # no server started, nothing written
