"""The documentation holds together: every relative link in README.md and docs/*.md reaches a file that exists and,
when it names an anchor, a heading of that file (GitHub's anchor rule); every ``--kv-*`` option the plugin registers
is on the options page, and every ``--kv-*`` the pages name is a real option; the public API page's examples run.

Docs whose commands run. Every shell block of README.md and docs/*.md (a fenced block without a language or
labelled ``sh``, ``bash``, ``shell``, ``console`` or ``yaml``: commands, a session of ``$ command`` lines with
their output, a command's output, or a workflow whose steps run commands) is one of two things, and
:func:`test_every_shell_block_is_run_by_a_test_or_marked_with_the_reason` checks that it is exactly one:

- **run by a test**: named in :data:`RUN` by its page and the start of its first line, with the test that runs it
  and what that test runs at reduced size or leaves out, and why. Commands run as written, by bash, in a scratch
  directory standing in for the checkout (:func:`scratch_checkout`: ``benchmarks`` links to the suite, the
  baseline is a copy, so nothing is written into the checkout), with this environment's ``python``, ``kvcache`` and
  a ``pytest`` script like pip's (which does not put the current directory on ``sys.path``) first on PATH. What a
  test reduces (the tiny model, few contexts, one round) it adds through ``PYTEST_ADDOPTS``, never by editing the
  command. Where the page shows output, it is compared: exactly where it is exact (counted figures, the runs of
  ``tests/data``), with ``...`` standing for the lines the page leaves out.
- **marked not run**, with the reason, by an HTML comment on the line just above its fence, invisible on the
  rendered page: ``<!-- not-run: needs a GPU -->``. The reasons: the default model's timed sweeps (minutes), the
  network (installs, clones, a package index), a GitHub Actions workflow, a dated measurement of another machine.

The commands that run the suite share one pool (:func:`page_runs`), three at a time, each in a scratch checkout."""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys
import unicodedata
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest
from kvrun import describe, environment, output

from kvcache import plugin

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
OPTIONS_PAGE = ROOT / "docs" / "options.md"

FENCE = re.compile(r"^(```|~~~)")
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")


def prose(text: str) -> str:
    """``text`` without fenced code blocks and inline code spans (neither holds links)."""
    lines, fenced = [], False
    for line in text.splitlines():
        if FENCE.match(line.lstrip()):
            fenced = not fenced
            lines.append("")
        else:
            lines.append("" if fenced else line)
    out = "\n".join(lines)
    out = re.sub(r"``.*?``", "code", out, flags=re.S)
    return re.sub(r"`[^`]*`", "code", out)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: its text (links as their text, inline code as its content) lower-cased,
    every character that is not a letter, a mark, a number, a connector (``_``), a space or a hyphen dropped,
    spaces turned into hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).replace("`", "").lower()
    kept = "".join(c for c in text if c in " -" or unicodedata.category(c)[0] in "LMN"
                   or unicodedata.category(c) == "Pc")
    return kept.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every heading anchor of a Markdown file, repeated headings numbered as GitHub numbers them (``-1``, ...)."""
    seen: dict[str, int] = {}
    found = set()
    fenced = False
    for line in path.read_text(encoding="utf-8").splitlines():
        if FENCE.match(line.lstrip()):
            fenced = not fenced
            continue
        match = None if fenced else HEADING.match(line)
        if match:
            base = slug(match.group(2))
            count = seen.get(base, 0)
            seen[base] = count + 1
            found.add(base if count == 0 else f"{base}-{count}")
    return found


def broken_links(page: Path) -> list[str]:
    problems = []
    for target in LINK.findall(prose(page.read_text(encoding="utf-8"))):
        if re.match(r"[a-z][a-z0-9+.-]*:", target, re.I):  # https:, mailto:, ...
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            problems.append(f"{page.name}: {target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            problems.append(f"{page.name}: {target}: no heading #{anchor} in {dest.name}")
    return problems


def test_slug_follows_githubs_rule():
    assert slug("Attention implementations (`--kv-attn`)") == "attention-implementations---kv-attn"
    assert slug("Per-op timed ledger: where a step's time goes") == "per-op-timed-ledger-where-a-steps-time-goes"
    assert slug("`flex_attention` on CPU") == "flex_attention-on-cpu"
    assert slug("The default sweep, 2026-11-30 (AMD EPYC)") == "the-default-sweep-2026-11-30-amd-epyc"
    assert slug("▲ KV-cache passes: regression") == "-kv-cache-passes-regression"


def test_numbered_anchors_and_code_are_handled(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("# A\n\n## Notes\n\n```sh\n# not a heading\n[x](missing.md)\n```\n\n## Notes\n\n"
                    "`[y](missing.md)` [z](#notes-1) [w](#not-there)\n")
    assert anchors(page) == {"a", "notes", "notes-1"}
    assert LINK.findall(prose(page.read_text())) == ["#notes-1", "#not-there"]
    assert broken_links(page) == ["page.md: #not-there: no heading #not-there in page.md"]


def test_pages_exist():
    names = {page.name for page in PAGES}
    assert "README.md" in names and len(PAGES) > 10, names


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page):
    assert broken_links(page) == []


def test_readme_stays_short():
    lines = (ROOT / "README.md").read_text(encoding="utf-8").count("\n")
    assert lines <= 220, f"README.md has {lines} lines: move the detail into a docs/ page, link it from the table"



# ``pip install "kvcache-passes[...]"`` with no ``@ git+...`` (or a path) after it: the short form, which installs only
# once a release is on PyPI. A page or a message that names it says so in the same breath ("PyPI", "published").
SHORT_INSTALL = re.compile(r"""pip install\s+(?:-\S+\s+)*["']?kvcache-passes\[[^\]]*\](?!\s*@)""")
PUBLISHED = re.compile(r"PyPI|published", re.I)


def short_installs(text: str) -> list[str]:
    """Every short-form install in ``text`` (lines joined, so a command wrapped over two lines counts) that is not
    marked, within its sentence's reach (120 characters either side), as the published name."""
    flat = re.sub(r"\s+", " ", text)
    return [m.group(0) for m in SHORT_INSTALL.finditer(flat)
            if not PUBLISHED.search(flat[max(0, m.start() - 120):m.end() + 120])]


def test_short_install_form_is_found_unless_marked_published():
    assert short_installs('`pip install "kvcache-passes[quantized]"`') == ['pip install "kvcache-passes[quantized]']
    assert short_installs("pip install\n'kvcache-passes[report]'") == ["pip install 'kvcache-passes[report]"]
    assert short_installs('pip install "kvcache-passes[bench] @ git+<this repository>"') == []
    assert short_installs('pip install "kvcache-passes[bench]" once a release is on PyPI') == []


INSTALL_TEXTS = [*PAGES, *sorted((ROOT / "kvcache").rglob("*.py")), *sorted((ROOT / ".github").rglob("*.y*ml")),
                 *sorted((ROOT / ".github").rglob("*.sh")), ROOT / "Makefile"]


def test_no_page_or_message_names_the_unpublished_short_install():
    """Until a release is on PyPI, ``pip install "kvcache-passes[...]"`` fails: pages and messages give the form
    that works from a checkout (``pip install -e ".[report]"``) or from git, or mark the short one as the published
    name."""
    found = {str(path.relative_to(ROOT)): short_installs(path.read_text(encoding="utf-8"))
             for path in INSTALL_TEXTS if path.exists()}
    assert {name: hits for name, hits in found.items() if hits} == {}



# ``pytest ... -p MODULE``: a module of the current directory is found by ``python -m pytest`` (which puts the
# current directory on sys.path) or with ``PYTHONPATH=``; the bare ``pytest`` script fails with "No module named".
PLUGIN_MODULE = re.compile(r"(?<![\w.-])pytest (?:[^`]{0,200}? )?-p (?!no:|kvcache)([A-Za-z_][\w.]*)")


def bare_pytest_with_local_module(text: str) -> list[str]:
    """Every ``pytest ... -p module`` in ``text`` (whitespace joined) run by the bare ``pytest`` script without
    ``PYTHONPATH``."""
    flat = re.sub(r"\s+", " ", text)
    return [m.group(0) for m in PLUGIN_MODULE.finditer(flat)
            if not flat[:m.start()].endswith("python -m ")
            and "PYTHONPATH=" not in flat[max(0, m.start() - 40):m.start()]]


def test_bare_pytest_with_a_local_module_is_found():
    assert bare_pytest_with_local_module("in this checkout\n`pytest benchmarks -p my_caches`") == [
        "pytest benchmarks -p my_caches"]
    assert bare_pytest_with_local_module("`python -m pytest benchmarks -p my_caches`") == []
    assert bare_pytest_with_local_module("`PYTHONPATH=. pytest benchmarks -p my_caches`") == []
    assert bare_pytest_with_local_module("`pytest benchmarks -p no:kvcache.plugin`") == []


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_pages_load_a_local_plugin_module_so_that_it_is_found(page):
    """A page's ``-p my_caches`` runs under ``python -m pytest`` (or names ``PYTHONPATH``), as README and
    attention.md say: the bare ``pytest`` exits 4 with ``No module named 'my_caches'``."""
    assert bare_pytest_with_local_module(page.read_text(encoding="utf-8")) == []



@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_a_page_that_says_python_m_build_says_to_install_build(page):
    """``python -m build`` fails with ``No module named build`` where ``build`` is not installed (no extra installs
    it): a page telling users to run it says ``pip install build`` beside it (within 120 characters)."""
    flat = re.sub(r"\s+", " ", page.read_text(encoding="utf-8"))
    bare = [m.start() for m in re.finditer(r"python -m build", flat)
            if "pip install build" not in flat[max(0, m.start() - 120):m.end() + 120]]
    assert bare == [], [flat[max(0, at - 60):at + 60] for at in bare]



def test_records_page_lists_every_verdict_in_the_measure_tables_order():
    """records.md's two lists of ``kv.verdict.<cache>.<measure>``'s measures are the measure table's ``VERDICTS``,
    in its order (``ledger`` was missing)."""
    from kvcache.analysing.judge.measure_table import VERDICTS

    names = [v.name for v in VERDICTS]
    flat = re.sub(r"\s+", " ", (ROOT / "docs" / "records.md").read_text(encoding="utf-8"))
    listed = re.search(r"\(measures (.*?), each `\{status", flat).group(1)
    assert re.findall(r"`(\w+)`", listed) == names, listed
    block = re.search(r"kv\.verdict\.<cache>\.<measure> +\{[^}]*\}; measures: (.*?) kv\.points", flat).group(1)
    depth, items, item = 0, [], ""
    for char in block:  # the items: split at the commas outside parentheses
        depth += {"(": 1, ")": -1}.get(char, 0)
        if char == "," and depth == 0:
            items, item = [*items, item], ""
        else:
            item += char
    assert [i.split()[0] for i in [*items, item]] == names, block


class OptionRecorder:
    """Stands in for pytest's parser and its option group: records the names ``pytest_addoption`` adds."""

    def __init__(self) -> None:
        self.names: set[str] = set()

    def getgroup(self, *args, **kwargs) -> OptionRecorder:
        return self

    def addoption(self, *names, **kwargs) -> None:
        self.names.update(names)


def registered_options() -> set[str]:
    recorder = OptionRecorder()
    plugin.pytest_addoption(recorder)
    return recorder.names


def options_page_flags() -> set[str]:
    """Every ``--kv-*`` named in the first column of the options page's table."""
    rows = [line for line in OPTIONS_PAGE.read_text(encoding="utf-8").splitlines() if line.startswith("| `--")]
    return {name for row in rows for name in re.findall(r"`(--kv-[a-z0-9-]+)`", row.split("|")[1])}


def test_options_page_lists_every_plugin_option():
    registered = registered_options()
    assert {"--kv-seed", "--kv-strict", "--kv-model"} <= registered
    documented = options_page_flags()
    assert not registered - documented, f"not in docs/options.md: {sorted(registered - documented)}"
    assert not documented - registered, f"in docs/options.md, not an option: {sorted(documented - registered)}"


def test_every_option_the_pages_name_exists():
    registered = registered_options()
    named = {(page.name, flag) for page in PAGES
             for flag in re.findall(r"--kv-[a-z0-9]+(?:-[a-z0-9]+)*", page.read_text(encoding="utf-8"))}
    unknown = sorted(f"{name}: {flag}" for name, flag in named if flag not in registered)
    assert unknown == [], unknown


def python_blocks(page: Path) -> list[str]:
    return re.findall(r"```python\n(.*?)```", page.read_text(encoding="utf-8"), re.S)


def test_unsupported_example_registers_a_class_skipped_with_its_reason(tmp_path):
    """The API page's ``prepare`` example, as written: ``Unsupported`` from :mod:`kvcache.caches` is the skip
    reason where there is no CUDA device."""
    example = next(block for block in python_blocks(ROOT / "docs" / "cache-classes.md") if "Unsupported" in block)
    (tmp_path / "unsupported_example.py").write_text(example)
    code = ("import torch, unsupported_example\n"
            "from kvcache.caches import get\n"
            "from kvcache.measuring.caches import cache_unavailable_reason\n"
            "spec = get('mine-cuda')\n"
            "assert not spec.in_all and spec.kinds == ('full',)\n"
            "print(cache_unavailable_reason(spec, 'cpu') if not torch.cuda.is_available() else 'cuda')\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=environment([tmp_path]),
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() in ("mine-cuda runs its own CUDA kernels: no CUDA device here", "cuda"), done.stdout



# --- Shell blocks: run by a test, or marked not run with the reason ------------------------------------------------

SHELL = ("", "sh", "bash", "shell", "console", "yaml")
OPENING = re.compile(r"^(\s*)(```|~~~)([\w+-]*)\s*$")
NOT_RUN = re.compile(r"^\s*<!-- not-run: (\S.*\S) -->\s*$")
THIS = "tests/suite/test_docs.py::"


@dataclass(frozen=True)
class Block:
    """A fenced block of a page: the line of its opening fence (1-based), its language, its text (less the fence's
    indent) and the reason it is not run (``<!-- not-run: REASON -->`` on the line above its fence), if any."""

    page: str
    line: int
    language: str
    text: str
    not_run: str | None

    def __str__(self) -> str:
        return f"{self.page}:{self.line}"


def fenced_blocks(path: Path) -> list[Block]:
    lines = path.read_text(encoding="utf-8").splitlines()
    found, i = [], 0
    while i < len(lines):
        opening = OPENING.match(lines[i])
        if not opening:
            i += 1
            continue
        indent, fence, language = opening.groups()
        end = next(j for j in range(i + 1, len(lines)) if lines[j].strip() == fence)
        text = "".join(f"{line.removeprefix(indent)}\n" for line in lines[i + 1:end])
        marker = NOT_RUN.match(lines[i - 1]) if i else None
        name = str(path.relative_to(ROOT)) if ROOT in path.parents else path.name
        found.append(Block(name, i + 1, language, text, marker and marker.group(1)))
        i = end + 1
    return found


def shell_blocks() -> list[Block]:
    return [block for page in PAGES for block in fenced_blocks(page) if block.language in SHELL]


@dataclass(frozen=True)
class RunBy:
    """The test that runs a block (``path::function``) and what it runs at reduced size or leaves out, and why
    ("": every command as written, output compared where the page shows it)."""

    test: str
    how: str = ""


ATTENTION_TEST = THIS + "test_attention_page_commands_run_as_written"
PULL_REQUESTS_TEST = THIS + "test_pull_request_page_examples_run_as_written"
SYNOPSIS = "a synopsis: its options are checked in --help"

#: The blocks a test runs: (page, the start of the block's first line) -> the test and how.
RUN: dict[tuple[str, str], RunBy] = {
    ("README.md", "python -m pytest --pyargs kvcache.benchmarks"): RunBy(
        "tests/suite/test_install.py::test_readme_command_runs_from_another_directory_with_the_users_classes",
        "from a directory outside the checkout with the built wheel; -m counted --kv-model tiny in PYTEST_ADDOPTS"),
    ("README.md", "git add my_caches.py kv-baseline.json"): RunBy(
        "tests/suite/test_readme.py::test_readme_commit_step_runs_as_written"),
    ("docs/attention.md", "pytest benchmarks -m counted --kv-attn sdpa,eager"): RunBy(
        ATTENTION_TEST,
        "lines 1 and 3; line 2 is not run: a timed sweep of the default model, flex_attention's compile included "
        "(about a minute on tiny), minutes in all; its pairs are counted by line 1 and tests/measuring"),
    ("docs/attention.md", "counted dynamic: 3.000 passes"): RunBy(
        ATTENTION_TEST, "the output of line 1 above, compared exactly"),
    ("docs/attention.md", "pytest benchmarks -m counted --kv-model tiny --kv-caches dynamic@eager"): RunBy(
        ATTENTION_TEST,
        "in a scratch copy of the checkout, whose kv-baseline.json must come out as committed but for the dates"),
    ("docs/attention.md", "python -m pytest benchmarks -m counted -p kv_extra_read"): RunBy(
        ATTENTION_TEST,
        "the page's module as kv_extra_read.py in the current directory; --kv-model tiny (what the page measured) "
        "in PYTEST_ADDOPTS"),
    ("docs/memory.md", "memory dynamic: allocated 1.000"): RunBy(
        ATTENTION_TEST,
        "a summary line of the default model's counted run: attention.md's line 1 prints it"),
    ("docs/pull-requests.md", "kvcache comment BASE.json HEAD.json"): RunBy(PULL_REQUESTS_TEST, SYNOPSIS),
    ("docs/pull-requests.md", "$ kvcache comment base.json head.json"): RunBy(PULL_REQUESTS_TEST),
    ("docs/pull-requests.md", "kvcache history add results.json"): RunBy(
        PULL_REQUESTS_TEST,
        "in a git repository, results.json being tests/data/tiny-run.json"),
    ("docs/pull-requests.md", "$ kvcache history add base.json"): RunBy(PULL_REQUESTS_TEST),
    ("docs/pull-requests.md", "kvcache export RUN.json"): RunBy(PULL_REQUESTS_TEST, SYNOPSIS),
    ("docs/pull-requests.md", "$ kvcache export base.json"): RunBy(PULL_REQUESTS_TEST),
    ("docs/running.md", "pip install -e"): RunBy(
        THIS + "test_running_page_commands_run",
        "lines 2 and 3 at reduced size (--kv-model tiny, contexts 256-1024, 1 round of 3 steps in PYTEST_ADDOPTS); "
        "line 1 is not run: it installs from a package index (the network) into the environment the tests run in"),
}


def block(page: str, start: str) -> Block:
    """The one shell block of ``page`` whose first line starts with ``start``."""
    found = [b for b in shell_blocks() if b.page == page and b.text.startswith(start)]
    assert len(found) == 1, f"{page}: {len(found)} shell blocks start with {start!r}"
    return found[0]


def test_block_parsing_reads_markers_indents_and_languages(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("# P\n\n<!-- not-run: needs a GPU -->\n```sh\nrun me\n```\n\n- item\n\n  ```\n  out\n  ```\n\n"
                    "```python\nx = 1\n```\n")
    found = fenced_blocks(page)
    assert [(b.line, b.language, b.text, b.not_run) for b in found] == [
        (4, "sh", "run me\n", "needs a GPU"), (10, "", "out\n", None), (14, "python", "x = 1\n", None)]


def test_every_shell_block_is_run_by_a_test_or_marked_with_the_reason():
    blocks = shell_blocks()
    assert len(blocks) > 30, len(blocks)
    claimed: dict[Block, RunBy] = {}
    for (page, start), run_by in RUN.items():
        claimed[block(page, start)] = run_by
        path, _, name = run_by.test.partition("::")
        assert f"\ndef {name}(" in (ROOT / path).read_text(encoding="utf-8"), f"{run_by.test}: no such test"
    problems = [f"{b}: neither run by a test (RUN) nor marked <!-- not-run: REASON -->" for b in blocks
                if b not in claimed and not b.not_run]
    problems += [f"{b}: both run ({claimed[b].test}) and marked not run" for b in blocks if b in claimed and b.not_run]
    assert problems == []


def commands(text: str) -> list[str]:
    """The commands of a block: its lines that are not blank or comments, ``\\``-continued lines joined."""
    out, pending = [], ""
    for line in text.splitlines():
        if not pending and (not line.strip() or line.lstrip().startswith("#")):
            continue
        pending += line
        if pending.endswith("\\"):
            pending = pending[:-1]
        else:
            out.append(pending)
            pending = ""
    return out


def session(text: str) -> list[tuple[str, list[str]]]:
    """A ``$ command`` session: each command and the output lines the page shows under it."""
    steps: list[tuple[str, list[str]]] = []
    for line in text.splitlines():
        if line.startswith("$ "):
            steps.append((line[2:], []))
        else:
            steps[-1][1].append(line)
    return steps


def shell_environment(tmp: Path, addopts: str = "") -> dict[str, str]:
    """Where a page's commands run: this environment's ``python`` and ``kvcache`` on PATH, after a ``pytest`` script
    like the one pip installs (its own folder on ``sys.path``, not the current directory's); pytest's cache off and
    ``addopts`` (a reduced size) through ``PYTEST_ADDOPTS``."""
    bin_dir = tmp / "bin"
    bin_dir.mkdir(exist_ok=True)
    script = bin_dir / "pytest"
    (entry,) = importlib.metadata.entry_points(group="console_scripts", name="pytest")  # what pip's script runs
    script.write_text(f"#!{sys.executable}\nimport sys\n\nfrom {entry.module} import {entry.attr}\n\n"
                      f"sys.exit({entry.attr}())\n")
    script.chmod(0o755)
    path = os.pathsep.join([str(bin_dir), str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    return environment(PATH=path, PYTEST_ADDOPTS=f"-p no:cacheprovider {addopts}".strip())


def scratch_checkout(where: Path) -> Path:
    """A folder standing in for this checkout: ``benchmarks`` links to the suite, ``pyproject.toml``,
    ``conftest.py`` and ``kv-baseline.json`` are copies; a command that records a baseline or writes a
    ``results.json`` writes there."""
    where.mkdir(parents=True)
    (where / "benchmarks").symlink_to(ROOT / "benchmarks", target_is_directory=True)
    for name in ("pyproject.toml", "conftest.py", "kv-baseline.json"):
        shutil.copy2(ROOT / name, where / name)
    return where


def run_shell(command: str, cwd: Path, env: dict[str, str], timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-c", command], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def shown_lines(done: subprocess.CompletedProcess) -> list[str]:
    return f"{done.stdout}{done.stderr}".rstrip("\n").splitlines()


# --- docs/pull-requests.md: kvcache comment, history and export on the recorded run (no torch) ----------------------


@pytest.fixture
def pull_request_runs(tmp_path) -> Path:
    """base.json: tests/data/tiny-run.json as it is; head.json: the same with a planted +2-pass copy in dynamic
    (what the page says they are)."""
    sys.path.insert(0, str(ROOT / "tests"))
    try:
        from fakerun import RECORDED_RUN, recorded_run, write_run
    finally:
        sys.path.remove(str(ROOT / "tests"))
    shutil.copy2(RECORDED_RUN, tmp_path / "base.json")
    write_run(tmp_path / "head.json", recorded_run(counted={"dynamic": 5.0}))
    return tmp_path


def test_pull_request_page_examples_run_as_written(pull_request_runs):
    """pull-requests.md on base.json and head.json: the comment, the history session and its steps.json, the export
    (up to its ``...``) print what the page shows; the synopses' options exist; the history block runs in a git
    repository and writes what its comment lists, beside the lock the page names."""
    tmp, page = pull_request_runs, "docs/pull-requests.md"
    env = shell_environment(tmp)
    for start in ("$ kvcache comment base.json head.json", "$ kvcache history add base.json"):
        for command, shown in session(block(page, start).text):
            done = run_shell(command, tmp, env)
            assert shown_lines(done) == shown, f"{command}\n{describe(done)}"
    steps = next(b for b in fenced_blocks(ROOT / page) if b.language == "json")  # trend/steps.json, as shown
    assert json.loads((tmp / "trend" / "steps.json").read_text()) == json.loads(steps.text)
    ((command, shown),) = session(block(page, "$ kvcache export base.json").text)
    done = run_shell(command, tmp, env)
    cut = shown.index("  ...")
    assert done.returncode == 0 and shown_lines(done)[:cut] == shown[:cut], describe(done)
    assert shown_lines(done)[-1] == shown[-1] == "]"
    for start in ("kvcache comment BASE.json HEAD.json", "kvcache export RUN.json"):
        synopsis = block(page, start).text
        usage = run_shell(" ".join(synopsis.split()[:2]) + " --help", tmp, env)
        assert usage.returncode == 0, describe(usage)
        assert set(re.findall(r"--[a-z-]+", synopsis)) <= set(re.findall(r"--[a-z-]+", usage.stdout)), synopsis
    repo = tmp / "repo"  # the history block: add results.json at HEAD (git's), then plot what its comment lists
    repo.mkdir()
    shutil.copy2(tmp / "base.json", repo / "results.json")
    git = {**env, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.com", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@example.com"}
    assert run_shell("git init -q && git add results.json && git commit -qm run", repo, git).returncode == 0
    add, plot = commands(block(page, "kvcache history add results.json").text)
    for command in (add, plot):
        done = run_shell(command, repo, git)
        assert done.returncode == 0, f"{command}\n{describe(done)}"
    listed = plot.split("#", 1)[1].strip().split(", ")
    assert {p.name for p in (repo / "trend").iterdir()} == set(listed), listed
    assert (repo / "history.jsonl.lock").exists()  # the lock the page tells a workflow to leave out of a commit


def test_reports_page_quotes_what_compare_prints(tmp_path, capsys):
    """reports.md's two quotes on an identity variable: compare's refusal (exit 2) and, with --allow-mismatch,
    its line naming the variable."""
    sys.path.insert(0, str(ROOT / "tests"))
    try:
        from fakerun import make_run, write_run
    finally:
        sys.path.remove(str(ROOT / "tests"))
    from kvcache.cli import main

    runs = []
    for name, variables in (("a.json", {}), ("b.json", {"TRANSFORMERS_SDPA_FORCE_GQA": "1"})):
        run = make_run()
        run["kv"]["environment"]["variables"] = variables
        runs.append(str(write_run(tmp_path / name, run)))
    page = " ".join((ROOT / "docs" / "reports.md").read_text(encoding="utf-8").split())
    assert main(["compare", *runs]) == 2
    refusal = capsys.readouterr().err.strip().replace(str(tmp_path) + "/", "")
    assert f"`{refusal}`" in page, refusal
    assert main(["compare", *runs, "--allow-mismatch"]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("Environment variable"))
    assert f"`{line}`" in page, line


# --- Commands that run the suite: one pool, shared by the tests below ------------------------------------------------


@pytest.fixture(scope="module")
def page_runs(tmp_path_factory) -> dict[str, tuple[subprocess.CompletedProcess, Path]]:
    """Every suite command the pages' tests run, a few at a time: {name: (result, the folder it ran in)}."""
    pytest.importorskip("torch")
    tmp = tmp_path_factory.mktemp("pages")
    attention = block("docs/attention.md", "pytest benchmarks -m counted --kv-attn sdpa,eager").text
    counted, _timed, traffic = commands(attention)
    extra_read = commands(block("docs/attention.md", "python -m pytest benchmarks -m counted -p kv_extra_read").text)
    module = next(b.text for b in fenced_blocks(ROOT / "docs" / "attention.md") if "extra_read_attention" in b.text)
    running = commands(block("docs/running.md", "pip install -e").text)[1:]
    reduced = ("--kv-model tiny --kv-contexts 256,512,1024 --kv-rounds 1 --kv-steps 3 --kv-warmup 1 "
               "--kv-copy-mib 16 --kv-ledger-steps 3")
    jobs = {
        "counted": ([counted], ""),
        "traffic": ([traffic], ""),
        "baseline": (commands(block("docs/attention.md", "pytest benchmarks -m counted --kv-model tiny").text), ""),
        "extra_read": (extra_read, "--kv-model tiny"),
        "running": (running, reduced),
    }

    def run(name: str) -> tuple[subprocess.CompletedProcess, Path]:
        lines, addopts = jobs[name]
        where = scratch_checkout(tmp / name)
        if name == "extra_read":
            (where / "kv_extra_read.py").write_text(module)
        env = shell_environment(where, addopts)
        done = None
        for command in lines:
            done = run_shell(command, where, env)
            if done.returncode != 0:
                break
        return done, where

    with ThreadPoolExecutor(max_workers=3) as pool:
        return dict(zip(jobs, pool.map(run, jobs)))


def test_attention_page_commands_run_as_written(page_runs):
    """attention.md: the default model counted under SDPA and eager prints the page's lines (and memory.md's), with
    no memory factor too small; kvcache traffic on tiny gives the page's 9.307 / 7.307; recording the eager entries
    changes no figure of the committed baseline; the page's own attention module, loaded with ``python -m pytest
    -p`` from the current directory, counts 4.000."""
    done, _ = page_runs["counted"]
    assert done.returncode == 0, describe(done)
    printed = output(done).splitlines()
    outputs = (("docs/attention.md", "counted dynamic: 3.000 passes"), ("docs/memory.md", "memory dynamic: allocated"))
    for start in outputs:  # the default model's counted lines, as the pages show them
        shown = [line.strip() for line in block(*start).text.splitlines()]
        assert [line for line in shown if line not in printed] == [], describe(done)
    assert "MEMORY FACTOR TOO SMALL" not in output(done)  # eager's repeat_kv copies are the attention's
    # the overhead table's rows: ops/step, data ops/step, ops/layer, fixed MB, weight passes
    overhead = {cells[0]: cells[1:] for cells in map(str.split, printed)
                if len(cells) == 6 and cells[0] in ("dynamic", "static")}
    gate_rows = {cells[1]: cells[2:7] for cells in (
        [c.strip() for c in line.strip("|").split("|")] for line in (ROOT / "docs" / "gate.md").read_text(
            encoding="utf-8").splitlines() if line.startswith("| smollm2-135m | "))}
    assert {c: gate_rows[c] for c in overhead} == overhead, describe(done)  # gate.md's table: what the run prints
    done, _ = page_runs["traffic"]
    assert done.returncode == 0, describe(done)
    assert "dynamic@eager: 9.307 counted passes" in done.stdout and "static@eager: 7.307 counted passes" in \
        done.stdout, describe(done)  # the page: "On `tiny` (2 layers) the same ops give 9.307 / 7.307"
    done, where = page_runs["baseline"]
    assert done.returncode == 0, describe(done)

    def undated(path: Path) -> str:  # the figures, not when or under which Transformers release they were recorded
        return re.sub(r'"(recorded|transformers)": "[^"]*"', r'"\1": ""', path.read_text())
    assert "baseline written to" in done.stdout, describe(done)
    assert json.loads(undated(where / "kv-baseline.json")) == json.loads(undated(ROOT / "kv-baseline.json"))
    done, _ = page_runs["extra_read"]
    assert done.returncode == 0, describe(done)
    assert "counted dynamic@extra_read: 4.000 passes = cat 2.00, scaled_dot_product_attention 1.00, sum 1.00" in \
        done.stdout, describe(done)


def test_running_page_commands_run(page_runs):
    """running.md: the suite writes results.json (reduced: tiny, three contexts, one round) and kvcache report
    writes the report from it."""
    done, where = page_runs["running"]
    assert done.returncode == 0, describe(done)
    assert (where / "results.json").is_file()
    assert {"report.html", "report.md", "latency.png", "traffic.png"} <= {p.name for p in (where / "report").iterdir()}


def test_a_suite_reached_through_a_link_is_the_suite(tmp_path):
    """What :func:`scratch_checkout` relies on: the plugin takes ``benchmarks/...`` under a link to the suite for
    the suite (its items measure), and a file beside it for none of it."""
    from types import SimpleNamespace

    from kvcache.plugin import discovery

    where = scratch_checkout(tmp_path / "checkout")
    config = SimpleNamespace(stash=pytest.Stash())
    config.stash[discovery.SUITE_DIRS] = (ROOT / "benchmarks",)
    assert discovery.in_suite(config, where / "benchmarks" / "test_traffic.py")
    assert not discovery.in_suite(config, where / "conftest.py")
