"""Imports only go downward: vfm_core never imports the Prefect layer; flows never import torch."""

from __future__ import annotations

import ast
from pathlib import Path

from benchmarks.code_health import parse  # ast.parse, a spurious thread-race error retried

REPO = Path(__file__).resolve().parents[1]


def imported_roots(path: Path) -> set[str]:
    tree = parse(path)
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


# Inside vfm_core the packages form layers, highest first; a module imports only from its own
# layer and the layers below (docs/architecture.md, "Layers"). Lazy imports inside functions count.
VFM_CORE_LAYERS = [
    ("cli", "cli_parser", "cli_sizing", "pipeline_report", "finetune_report"),
    ("train", "infer", "search", "curate", "registry"),
    ("checkpoints", "launch"),
    ("perf",),
    ("parallel",),
    ("families",),
    ("models", "diffusion", "tokenizer"),
    ("data",),
    (
        "video",
        "annotate",
        "storage",
        "config",
        "config_build",
        "config_fields",
        "config_validate",
        "contracts",
        "recipes",
        "tracking",
        "tracking_logger",
        "tracking_backlog",
        "infra_env",
        "geometry",
        "errors",
        "output_lock",
        "cli_types",
        "progress",
        "rng",
        "openmp",
    ),
]


def vfm_core_edges(path: Path) -> set[str]:
    """The vfm_core packages / modules ``path`` imports (``vfm_core.X...`` -> X)."""
    tree = parse(path)
    out = set()
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        out |= {n.split(".")[1] for n in names if n.startswith("vfm_core.") and n.count(".") >= 1}
    return out


def test_vfm_core_layers_only_point_down():
    layer = {name: i for i, names in enumerate(VFM_CORE_LAYERS) for name in names}
    root = REPO / "vfm_core"
    unplaced, upward = [], []
    for path in sorted(root.rglob("*.py")):
        top = path.relative_to(root).parts[0].removesuffix(".py")
        if top == "__init__":
            continue
        if top not in layer:
            unplaced.append(top)
            continue
        for target in vfm_core_edges(path):
            if target in layer and layer[target] < layer[top]:
                upward.append(f"{path.relative_to(REPO)} imports vfm_core.{target}")
            elif target not in layer:
                unplaced.append(target)
    assert not unplaced, f"packages in no layer: {sorted(set(unplaced))}"
    assert upward == []


OWNERS = ("train", "infer", "registry")
"""Packages of one layer that never import each other: what two of them share lives below them
(checkpoints, launch, tracking_logger; issue #47, "Owners")."""


def test_train_infer_registry_do_not_import_each_other():
    root = REPO / "vfm_core"
    crossing = [
        f"{path.relative_to(REPO)} imports vfm_core.{target}"
        for owner in OWNERS
        for path in sorted((root / owner).rglob("*.py"))
        for target in sorted(vfm_core_edges(path) & set(OWNERS) - {owner})
    ]
    assert crossing == []


def test_owner_check_sees_lazy_imports(tmp_path):
    lazy = tmp_path / "lazy.py"
    lazy.write_text("def f():\n    from vfm_core.infer.run import generate_request\n")
    assert vfm_core_edges(lazy) == {"infer"}


def test_no_file_cycles_in_vfm_core():
    """Inside vfm_core no two files import each other, directly or round a cycle (lazy imports
    inside functions count), and no private name (leading underscore) is imported from another
    file: a shared piece lives in the module that owns it, or in a small module below its users
    (issue #47, "split by responsibility"; benchmarks/code_health.py measures both)."""
    from benchmarks.code_health import measure

    m = measure()
    cycles = "\n".join(" <-> ".join(c) for c in m["file_cycles"])
    assert m["file_cycles"] == [], f"file cycles in vfm_core:\n{cycles}"
    private = "\n".join(m["_private_imports"])
    assert m["private_cross_file_imports"] == 0, f"private names imported across files:\n{private}"
