"""The two wings, kept apart: the analysing wing never imports torch, transformers, the measuring wing or
the faces; neither wing imports a face; and no Python file of the repository (the package, its tests, the
benchmarks, the scripts) imports one that imports it back (statically, every import, function-level ones
included)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "kvcache"
FACES = ("kvcache.plugin", "kvcache.commands", "kvcache.cli", "kvcache.caches", "kvcache.ab", "kvcache.bisect",
         "kvcache.sentinel", "kvcache.testing")
WINGS = ("measuring", "analysing")
FORBIDDEN_IN_ANALYSING = ("torch", "transformers", "kvcache.measuring", *FACES)
#: Where a plain ``import name`` of a file outside the package is looked for besides the file's own folder: the
#: folders pytest and the scripts put first on ``sys.path``.
SEARCHED = (ROOT / "tests", ROOT / "tests" / "suite", ROOT / "scripts", ROOT)
SKIPPED = (".venv", ".git", "build", "dist", "node_modules")


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path) -> set[str]:
    """Every module ``path`` imports, resolved to dotted names (``from kvcache import gate`` -> kvcache.gate)."""
    out = set()
    here = module_name(path) if path.is_relative_to(PACKAGE) else path.stem
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


def matches(name: str, prefixes: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def python_files() -> list[Path]:
    """The repository's own Python files: what git tracks or would (not what it ignores: ``.venv``, the releases
    installed under ``.versions``, build outputs); without git, every file outside :data:`SKIPPED`."""
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "--", "*.py"], cwd=ROOT,
                            capture_output=True, text=True)
    if listed.returncode == 0 and listed.stdout.strip():
        return sorted(ROOT / name for name in listed.stdout.split() if (ROOT / name).is_file())
    return sorted(p for p in ROOT.rglob("*.py") if not set(p.relative_to(ROOT).parts) & set(SKIPPED))


def file_of(name: str, importer: Path, package: dict[str, Path]) -> Path | None:
    """The repository's file an imported name stands for: a module of the package, or a file beside the importer
    (or in a folder of :data:`SEARCHED`) for a plain name; None for anything else (the standard library, a
    dependency)."""
    if name in package:
        return package[name]
    if "." in name or name == "kvcache":
        return None
    for folder in (importer.parent, *SEARCHED):
        if (folder / f"{name}.py").is_file():
            return folder / f"{name}.py"
    return None


def import_graph() -> dict[Path, set[Path]]:
    """Each Python file of the repository -> the files of the repository it imports."""
    files = python_files()
    package = {module_name(p): p for p in files if p.is_relative_to(PACKAGE)}
    graph = {}
    for path in files:
        found = {file_of(name, path, package) for name in imports(path)}
        graph[path] = {f for f in found if f is not None and f != path}
    return graph


def test_analysing_imports_no_torch_and_no_measuring():
    for path in (PACKAGE / "analysing").rglob("*.py"):
        bad = sorted(i for i in imports(path) if matches(i, FORBIDDEN_IN_ANALYSING))
        assert not bad, f"{path.name} imports {bad}"


def test_no_wing_imports_a_face():
    for wing in WINGS:
        for path in (PACKAGE / wing).rglob("*.py"):
            bad = sorted(i for i in imports(path) if matches(i, FACES))
            assert not bad, f"{path.relative_to(ROOT)} imports {bad}"


def test_no_import_cycle_in_the_repository():
    graph = import_graph()
    state: dict[Path, int] = {}

    def visit(node: Path, stack: list[Path]) -> None:
        state[node] = 1
        for dep in sorted(graph[node]):
            if state.get(dep) == 1:
                cycle = stack[stack.index(dep):] + [dep] if dep in stack else [node, dep]
                raise AssertionError(f"import cycle: {' -> '.join(str(p.relative_to(ROOT)) for p in cycle)}")
            if dep not in state:
                visit(dep, [*stack, dep])
        state[node] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])


def test_the_cycle_check_sees_scripts_and_tests():
    graph = import_graph()
    assert ROOT / "scripts" / "gate_power_series.py" in graph[ROOT / "scripts" / "gate_power_ab.py"]
    assert ROOT / "tests" / "fakerun.py" in graph[ROOT / "tests" / "without_torch" / "test_report.py"]
    assert PACKAGE / "analysing" / "records" / "__init__.py" in graph[ROOT / "scripts" / "gate_power.py"]


def test_analysing_modules_import_with_torch_absent():
    names = [module_name(p) for p in (PACKAGE / "analysing").rglob("*.py")]
    code = ("import sys\nfor blocked in ('torch', 'transformers'):\n    sys.modules[blocked] = None\n"
            f"for name in {names!r}:\n    __import__(name)\n"
            "assert not any(m.startswith('kvcache.measuring') for m in sys.modules), sorted(sys.modules)\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=PACKAGE.parent, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


#: Names that many modules define on purpose, each for the same role: a command's ``main``, ``parser`` and ``work``,
#: pytest's hooks, a ``-p`` plug-in's ``register``.
ROLE_NAMES = ("main", "parser", "work", "register")


def top_level_names(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    return {n for n in names if not n.startswith("__") and n not in ROLE_NAMES and not n.startswith("pytest_")}


def test_one_name_per_thing():
    """No two modules of the package define the same top-level name (besides :data:`ROLE_NAMES` and pytest hooks):
    a name found in two places is two things, and one of them should say what it is."""
    where: dict[str, list[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        for name in top_level_names(path):
            where.setdefault(name, []).append(module_name(path))
    twice = {name: mods for name, mods in where.items() if len(mods) > 1}
    assert not twice, twice


def one_letter_apart(a: str, b: str) -> bool:
    if len(a) == len(b):
        return sum(x != y for x, y in zip(a, b)) == 1
    short, long_ = sorted((a, b), key=len)
    return len(long_) - len(short) == 1 and any(long_[:i] + long_[i + 1:] == short for i in range(len(long_)))


def test_no_two_files_a_letter_apart():
    stems = sorted({p.stem for p in PACKAGE.rglob("*.py")} - {"__init__"})
    close = [(a, b) for i, a in enumerate(stems) for b in stems[i + 1:] if one_letter_apart(a, b)]
    assert not close, close


def test_the_top_level_shows_the_wings_the_plugin_and_the_commands():
    """At most 10 modules at the top of ``kvcache/`` besides its subpackages."""
    modules = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(modules) <= 10, modules


#: The longest a module of the package may be (architecture.md says so, and names the one over 400 lines).
MAX_MODULE_LINES = 450


def test_no_module_is_over_the_limit_architecture_md_states():
    lengths = {str(path.relative_to(ROOT)): len(path.read_text(encoding="utf-8").splitlines())
               for path in PACKAGE.rglob("*.py")}
    assert {name: n for name, n in lengths.items() if n > MAX_MODULE_LINES} == {}
    page = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    assert f"over {MAX_MODULE_LINES}\nlines" in page or f"over {MAX_MODULE_LINES} lines" in page
    over_400 = sorted(name for name, n in lengths.items() if n > 400)
    assert all(f"`{name}`" in page for name in over_400), f"over 400 lines, not named in architecture.md: {over_400}"


def test_every_package_of_kvcache_is_in_the_wheel():
    """pyproject.toml lists the wheel's packages by name: a new subpackage left out of it installs without its
    modules (an ImportError in every installed run, never in the checkout)."""
    import pytest

    tomllib = pytest.importorskip("tomllib")  # Python 3.11 and later
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["setuptools"]
    listed = set(setuptools["packages"])
    found = {module_name(init) for init in PACKAGE.rglob("__init__.py")}
    assert found - listed == set()
