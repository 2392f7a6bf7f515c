"""Ownership figures of the code base (issue #47), printed as one table.

    python benchmarks/code_health.py            # the table
    python benchmarks/code_health.py --json     # the same figures as JSON

What each row counts:
- `"ar"` comparisons outside families/: string literals "ar" compared with ==, !=, in / not in.
- declarations of a parallel degree: a class field, dataclass field or CLI flag named after it
  (dp_shard, dp_replicate, tp, cp, pp) in vfm_core, flows, tasks.
- package cycles / file cycles: strongly connected components of the import graph of vfm_core
  (lazy imports inside functions count; TYPE_CHECKING blocks do not).
- private cross-file imports: `from M import _name` where M is another project module.
- functions over 60 / 80 lines: in vfm_core.
- README lines.
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CODE = ("vfm_core", "flows", "tasks")
DEGREES = ("dp_shard", "dp_replicate", "tp", "cp", "pp")


def py_files(*folders: str) -> list[Path]:
    return sorted(p for f in folders for p in (REPO / f).rglob("*.py"))


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def parse(path: Path) -> ast.Module:
    """`path`'s AST. CPython 3.11 keeps the AST constructor's recursion depth in state that all
    threads share (python/cpython#106905): a thread of another library building an AST at the
    same time (Ray's, in a test worker that ran Ray before) makes a good parse raise a spurious
    ``SystemError: AST constructor recursion depth mismatch``; that one is tried again."""
    text = path.read_text()
    for _ in range(4):
        try:
            return ast.parse(text, filename=str(path))
        except SystemError as e:
            if "recursion depth mismatch" not in str(e):
                raise
    return ast.parse(text, filename=str(path))  # a fifth mismatch is raised


def ar_comparisons(tree: ast.Module) -> int:
    def is_ar(node: ast.AST) -> bool:
        if isinstance(node, ast.Constant) and node.value == "ar":
            return True
        return isinstance(node, ast.Tuple | ast.List | ast.Set) and any(map(is_ar, node.elts))

    return sum(
        1
        for node in ast.walk(tree)
        if isinstance(node, ast.Compare) and any(map(is_ar, [node.left, *node.comparators]))
    )


def degree_declarations(tree: ast.Module) -> dict[str, int]:
    found: dict[str, int] = defaultdict(int)
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            for stmt in node.body:
                if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
                    if stmt.target.id in DEGREES:
                        found[stmt.target.id] += 1
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "add_argument":
            for arg in node.args:
                if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                    name = arg.value.lstrip("-").replace("-", "_")
                    if name in DEGREES:
                        found[name] += 1
    return found


def _type_checking(node: ast.AST) -> bool:
    test = getattr(node, "test", None)
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(test)


def imports(tree: ast.Module, module: str, is_package: bool) -> list[tuple[str, list[str]]]:
    """(imported module, imported names) for every import outside TYPE_CHECKING blocks."""
    out: list[tuple[str, list[str]]] = []
    skip = {id(n) for node in ast.walk(tree) if _type_checking(node) for n in ast.walk(node)}
    package = module if is_package else module.rpartition(".")[0]
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            out += [(a.name, []) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            out.append((base, [a.name for a in node.names]))
    return out


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    counter = [0]
    sys.setrecursionlimit(10_000)

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in list(graph):
        if v not in index:
            visit(v)
    return out


def measure() -> dict:
    files = py_files(*CODE)
    modules = {module_name(p): p for p in files}
    trees = {m: parse(p) for m, p in modules.items()}

    ar_outside = sum(
        ar_comparisons(t) for m, t in trees.items() if not m.startswith("vfm_core.families")
    )
    degrees: dict[str, int] = defaultdict(int)
    for t in trees.values():
        for k, v in degree_declarations(t).items():
            degrees[k] += v

    file_graph: dict[str, set[str]] = defaultdict(set)
    private: list[str] = []
    for m, t in trees.items():
        is_pkg = modules[m].name == "__init__.py"
        for target, names in imports(t, m, is_pkg):
            candidates = [target] + [f"{target}.{n}" for n in names]
            for c in candidates:
                if c in modules and c != m:
                    file_graph[m].add(c)
            if target in modules and target != m:
                private += [f"{m} <- {target}.{n}" for n in names if n.startswith("_")]
    core_graph = {
        m: {t for t in ts if t.startswith("vfm_core.") and not modules[t].name == "__init__.py"}
        for m, ts in file_graph.items()
        if m.startswith("vfm_core.") and modules[m].name != "__init__.py"
    }
    file_cycles = strongly_connected(core_graph)

    def package_of(m: str) -> str:
        parts = m.split(".")
        return ".".join(parts[:2]) if len(parts) > 2 or modules[m].name == "__init__.py" else m

    pkg_graph: dict[str, set[str]] = defaultdict(set)
    for m, ts in file_graph.items():
        if not m.startswith("vfm_core."):
            continue
        for t in ts:
            if t.startswith("vfm_core.") and package_of(t) != package_of(m):
                pkg_graph[package_of(m)].add(package_of(t))
    package_cycles = strongly_connected(pkg_graph)

    lengths = []
    for m, t in trees.items():
        if not m.startswith("vfm_core"):
            continue
        for node in ast.walk(t):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lengths.append((node.end_lineno - node.lineno + 1, f"{m}.{node.name}"))
    readme = (REPO / "README.md").read_text().splitlines()
    return {
        "ar_comparisons_outside_families": ar_outside,
        "parallel_degree_declarations": dict(sorted(degrees.items())),
        "package_cycles": package_cycles,
        "file_cycles": file_cycles,
        "private_cross_file_imports": len(private),
        "functions_over_60_lines": sum(n > 60 for n, _ in lengths),
        "functions_over_80_lines": sum(n > 80 for n, _ in lengths),
        "longest_functions": [f"{name} {n}" for n, name in sorted(lengths, reverse=True)[:5]],
        "readme_lines": len(readme),
        "_private_imports": private,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="print the figures as JSON")
    ap.add_argument("--verbose", action="store_true", help="also list cycles and private imports")
    args = ap.parse_args(argv)
    m = measure()
    if args.json:
        print(json.dumps(m, indent=2))
        return 0
    deg = m["parallel_degree_declarations"]
    rows = [
        ('"ar" comparisons outside families/', m["ar_comparisons_outside_families"]),
        *[(f"declarations of {k}", deg.get(k, 0)) for k in DEGREES],
        ("package cycles (vfm_core)", len(m["package_cycles"])),
        ("file cycles (vfm_core)", len(m["file_cycles"])),
        ("private cross-file imports", m["private_cross_file_imports"]),
        ("functions over 60 lines (vfm_core)", m["functions_over_60_lines"]),
        ("functions over 80 lines (vfm_core)", m["functions_over_80_lines"]),
        ("README lines", m["readme_lines"]),
    ]
    width = max(len(r[0]) for r in rows)
    print(f"{'figure':<{width}}  value")
    for name, value in rows:
        print(f"{name:<{width}}  {value}")
    print("longest:", ", ".join(m["longest_functions"]))
    if args.verbose:
        for c in m["package_cycles"] + m["file_cycles"]:
            print("cycle:", " <-> ".join(c))
        for p in m["_private_imports"]:
            print("private:", p)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
