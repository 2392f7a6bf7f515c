"""The README and docs/ stay navigable: a short README, relative links that resolve, and the
`vfm` subcommands named in the README's command table exist in the parser."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from vfm_core.cli_parser import build_parser

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]
MAX_README_LINES = 260

LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.S | re.M)


def _links(page: Path) -> list[str]:
    """Relative link targets of ``page`` (outside code blocks; no URLs, no same-page anchors)."""
    text = FENCE.sub("", page.read_text())
    return [
        t
        for t in LINK.findall(text)
        if not re.match(r"^[a-z][a-z0-9+.-]*:", t) and not t.startswith("#")
    ]


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _command_table(text: str) -> list[str]:
    """The first column of the README's '## Commands' table."""
    section = text.split("\n## Commands\n", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| ")]
    return [row.split(" | ")[0].removeprefix("| ") for row in rows[1:]]  # rows[0]: the header


def test_readme_is_short() -> None:
    n = len(README.read_text().splitlines())
    assert n <= MAX_README_LINES, f"README.md has {n} lines (at most {MAX_README_LINES})"


def test_relative_links_resolve() -> None:
    broken = []
    for page in PAGES:
        for target in _links(page):
            path = target.split("#", 1)[0]
            resolved = (page.parent / path).resolve()
            if not resolved.exists():
                broken.append(f"{page.relative_to(ROOT)}: {target}")
            elif ROOT not in resolved.parents and resolved != ROOT:
                broken.append(f"{page.relative_to(ROOT)}: {target} (outside the repository)")
    assert not broken, "links that do not resolve:\n" + "\n".join(broken)


def test_readme_never_points_at_shared() -> None:
    assert "../shared" not in README.read_text()


def test_readme_command_table_names_real_subcommands() -> None:
    commands = _subcommands(build_parser())
    named = []
    for cell in _command_table(README.read_text()):
        for words in re.findall(r"`vfm ([a-z][a-z-]*(?: [a-z][a-z-]*)?)", cell):
            first, _, second = words.partition(" ")
            named.append(first)
            assert first in commands, f"README names `vfm {first}`, not a vfm subcommand"
            nested = _subcommands(commands[first])
            if nested:  # vfm tokenizer train, vfm checkpoint verify, vfm track backfill
                assert second in nested, f"README names `vfm {words}`: {first} has {list(nested)}"
    assert len(named) >= 10, f"the command table names only {named}"
