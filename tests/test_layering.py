"""Imports only go downward: vfm_core never imports the Prefect layer; flows never import torch."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def imported_roots(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    roots = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            roots |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            roots.add(node.module.split(".")[0])
    return roots


def violations(folder: str, forbidden: set[str]) -> list[str]:
    files = sorted((REPO / folder).rglob("*.py"))
    assert files, f"no Python files under {folder}/"
    return [
        f"{p.relative_to(REPO)} imports {sorted(imported_roots(p) & forbidden)}"
        for p in files
        if imported_roots(p) & forbidden
    ]


def test_vfm_core_never_imports_prefect_layer():
    assert violations("vfm_core", {"prefect", "tasks", "flows"}) == []


def test_flows_never_import_torch():
    assert violations("flows", {"torch"}) == []


def test_tasks_never_import_flows():
    assert violations("tasks", {"flows"}) == []


def test_checker_detects_a_violation(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("import os\nfrom prefect import flow\nimport torch.nn as nn\n")
    assert imported_roots(bad) == {"os", "prefect", "torch"}
