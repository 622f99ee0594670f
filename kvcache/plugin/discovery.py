"""Where the suite is and what its items measure: the suite's directories (:func:`suite_dirs`), whether a path or
the run's arguments reach them (:func:`in_suite`, :func:`collects_suite`), and the role of a suite item
(:func:`item_role`)."""

from __future__ import annotations

import fnmatch
import importlib.util
from pathlib import Path
from typing import Any

import pytest

SUITE_DIRS = pytest.StashKey["tuple[Path, ...]"]()
SUITE_PACKAGE = "kvcache.benchmarks"  # the suite, shipped in the package (benchmarks/ in a checkout)


def suite_dirs(config: pytest.Config) -> tuple[Path, ...]:
    """The directories of the suite's test files: the ``kvcache.benchmarks`` package (installed, or mapped
    by an editable install) and, in a source checkout, ``benchmarks/`` beside the ``kvcache`` package.
    Found once per session, each as given and resolved."""
    dirs = config.stash.get(SUITE_DIRS, None)
    if dirs is None:
        import kvcache

        found = [Path(p) for p in _package_locations(SUITE_PACKAGE)]
        checkout = Path(kvcache.__file__).resolve().parent.parent
        if (checkout / "pyproject.toml").is_file() and (checkout / "benchmarks" / "conftest.py").is_file():
            found.append(checkout / "benchmarks")
        dirs = config.stash[SUITE_DIRS] = tuple(dict.fromkeys([*found, *(p.resolve() for p in found)]))
    return dirs


def _package_locations(name: str) -> list[str]:
    """A module's file or a package's directories, without running it (its parent packages are imported)."""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return []
    if spec is None:
        return []
    if spec.submodule_search_locations:
        return list(spec.submodule_search_locations)
    return [spec.origin] if spec.origin and spec.origin not in ("built-in", "frozen") else []


def in_suite(config: pytest.Config, path: Path) -> bool:
    """Whether ``path`` (a test file or directory) is part of the suite, reached directly or through a symbolic
    link (a scratch directory whose ``benchmarks`` links to a checkout's)."""
    paths = dict.fromkeys([Path(path), Path(path).resolve()])
    return any(p == d or d in p.parents for p in paths for d in suite_dirs(config))


def collects_suite(config: pytest.Config) -> bool:
    """Whether the run's arguments reach the suite: a path in it (``pytest benchmarks``, a node id), a
    ``--pyargs`` module name in it (``pytest --pyargs kvcache.benchmarks``), or a directory above it from
    which pytest would recurse into it (the repository's root, but not a project whose virtual environment
    holds the installed suite). No arguments: pytest's own choice (``testpaths`` or the current directory)."""
    dirs = suite_dirs(config)
    if not dirs:
        return False
    base = config.invocation_params.dir
    ignored = [Path(base, p).resolve() for p in (config.getoption("ignore", None) or [])]
    skip = config.getini("norecursedirs")
    for arg in config.args:
        target = str(arg).split("::")[0]
        located = _package_locations(target) if config.option.pyargs else []
        path = Path(base, located[0] if located else target).resolve()
        for suite in dirs:
            if path == suite or suite in path.parents:
                return True
            if path in suite.parents and not any(p == suite or p in suite.parents for p in ignored):
                between = [suite, *suite.parents[:len(suite.parents) - len(path.parents) - 1]]
                if not any(any(fnmatch.fnmatch(d.name, pattern) for pattern in skip) or (d / "pyvenv.cfg").exists()
                           for d in between):
                    return True
    return False




def item_role(item: pytest.Item) -> tuple[str, Any]:
    """What a suite item measures and its key: ``counted`` (class), ``copy`` (label), ``point`` (PointId),
    ``ledger`` (PointId), ``remeasure`` (index), ``drift``; ``other`` for anything else."""
    if not in_suite(item.config, item.path):
        return "other", None
    params = getattr(getattr(item, "callspec", None), "params", {})
    if "kv_cache" in params:
        return "counted", params["kv_cache"]
    if "kv_copy_label" in params:
        return "copy", params["kv_copy_label"]
    if "kv_point" in params:
        return "point", params["kv_point"]
    if "kv_ledger" in params:
        return "ledger", params["kv_ledger"]
    if "kv_remeasure" in getattr(item, "fixturenames", ()):
        return "remeasure", params.get("kv_remeasure")
    if "kv_drift" in getattr(item, "fixturenames", ()):
        return "drift", None
    return "other", None
