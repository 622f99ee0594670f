"""The documentation holds together: every relative link in README.md and docs/*.md reaches a file that exists and,
when it names an anchor, a heading of that file (GitHub's anchor rule); every ``--kv-*`` option the plugin registers
is on the options page, and every ``--kv-*`` the pages name is a real option; the public API page's examples run."""

from __future__ import annotations

import re
import subprocess
import sys
import unicodedata
from pathlib import Path

import pytest
from kvrun import environment

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


def test_cache_classes_page_shows_the_readmes_example():
    """The API page's first example is the README's, which tests/suite/test_readme.py runs."""
    from test_readme import readme_example

    assert python_blocks(ROOT / "docs" / "cache-classes.md")[0] == readme_example()


def test_unsupported_example_registers_a_class_skipped_with_its_reason(tmp_path):
    """The API page's ``prepare`` example, as written: ``Unsupported`` from :mod:`kvcache.caches` is the skip
    reason where there is no CUDA device."""
    example = next(block for block in python_blocks(ROOT / "docs" / "cache-classes.md") if "Unsupported" in block)
    (tmp_path / "unsupported_example.py").write_text(example)
    code = ("import torch, unsupported_example\n"
            "from kvcache.caches import get\n"
            "from kvcache.measuring.caches import unavailable_reason\n"
            "spec = get('mine-cuda')\n"
            "assert not spec.in_all and spec.kinds == ('full',)\n"
            "print(unavailable_reason(spec, 'cpu') if not torch.cuda.is_available() else 'cuda')\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=environment([tmp_path]),
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() in ("mine-cuda runs its own CUDA kernels: no CUDA device here", "cuda"), done.stdout
