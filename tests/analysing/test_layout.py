"""The two wings, kept apart: the analysing wing never imports torch, transformers, the measuring wing or
the faces, and no module of the package imports one that imports it back (statically, every import,
function-level ones included)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "kvcache"
FACES = ("kvcache.plugin", "kvcache.commands", "kvcache.cli", "kvcache.caches", "kvcache.ab", "kvcache.bisect",
         "kvcache.sentinel", "kvcache.testing")
FORBIDDEN_IN_ANALYSING = ("torch", "transformers", "kvcache.measuring", *FACES)


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path) -> set[str]:
    """Every module ``path`` imports, resolved to dotted names (``from kvcache import gate`` -> kvcache.gate)."""
    out = set()
    here = module_name(path)
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = here.split(".")[: -node.level] if path.name != "__init__.py" else here.split(".")
                base = ".".join([*package, base] if base else package)
            out.add(base)
            out.update(f"{base}.{alias.name}" for alias in node.names)
    return out


def modules() -> dict[str, set[str]]:
    found = {module_name(p): imports(p) for p in PACKAGE.rglob("*.py")}
    return {name: {i for i in deps if i in found and i != name} for name, deps in found.items()}


def test_analysing_imports_no_torch_and_no_measuring():
    for path in (PACKAGE / "analysing").rglob("*.py"):
        bad = sorted(i for i in imports(path) if any(i == f or i.startswith(f + ".") for f in FORBIDDEN_IN_ANALYSING))
        assert not bad, f"{path.name} imports {bad}"


def test_no_import_cycle_in_the_package():
    graph = modules()
    state: dict[str, int] = {}

    def visit(node: str, stack: list[str]) -> None:
        state[node] = 1
        for dep in sorted(graph[node]):
            if state.get(dep) == 1:
                cycle = stack[stack.index(dep):] + [dep] if dep in stack else [node, dep]
                raise AssertionError(f"import cycle: {' -> '.join(cycle)}")
            if dep not in state:
                visit(dep, [*stack, dep])
        state[node] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])


def test_analysing_modules_import_with_torch_absent():
    names = [module_name(p) for p in (PACKAGE / "analysing").rglob("*.py")]
    code = ("import sys\nfor blocked in ('torch', 'transformers'):\n    sys.modules[blocked] = None\n"
            f"for name in {names!r}:\n    __import__(name)\n"
            "assert not any(m.startswith('kvcache.measuring') for m in sys.modules), sorted(sys.modules)\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=PACKAGE.parent, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
