"""The README keeps up with the code: its registration example works as written (a user's cache class plugs in
without editing the project: taken from README.md's "Gate your own cache class in your CI", loaded with ``-p`` and
counted), and its step 3 (commit the class and the baseline) runs as written in a git repository. The README's
command from another repository is run as written by ``tests/suite/test_install.py``; links, the options page and
which of the README's shell blocks run (and where) are checked by ``tests/suite/test_docs.py``."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from kvrun import environment

ROOT = Path(__file__).resolve().parents[2]
SECTION = "## Gate your own cache class in your CI"


def readme_example() -> str:
    """The first Python block of the README's section on gating your own class."""
    section = (ROOT / "README.md").read_text(encoding="utf-8").split(f"\n{SECTION}\n", 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_cache_classes_page_shows_the_readmes_example():
    """The API page's first example is the README's, which the next test runs."""
    page = (ROOT / "docs" / "cache-classes.md").read_text(encoding="utf-8")
    assert re.findall(r"```python\n(.*?)```", page, re.S)[0] == readme_example()


def test_readme_registration_example_runs(tmp_path):
    (tmp_path / "my_caches.py").write_text(readme_example())
    cmd = [sys.executable, "-m", "pytest", "benchmarks", "-p", "my_caches", "-m", "counted", "--kv-model", "tiny",
           "--kv-caches", "mine", "--kv-no-gate", "-p", "no:cacheprovider", "-q",
           "--benchmark-json", str(tmp_path / "run.json")]
    done = subprocess.run(cmd, cwd=ROOT, env=environment([tmp_path]), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "counted mine: 3.000 passes" in done.stdout


def test_readme_commit_step_runs_as_written(tmp_path):
    """Step 3, "Commit it": the README's command, run by bash in a git repository holding the two files steps 1 and
    2 leave there, commits both."""
    from test_docs import block, commands, run_shell

    (tmp_path / "my_caches.py").write_text(readme_example())
    (tmp_path / "kv-baseline.json").write_text((ROOT / "kv-baseline.json").read_text())
    env = environment(GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@example.com", GIT_COMMITTER_NAME="t",
                      GIT_COMMITTER_EMAIL="t@example.com")
    assert run_shell("git init -q", tmp_path, env).returncode == 0
    (command,) = commands(block("README.md", "git add my_caches.py kv-baseline.json").text)
    done = run_shell(command, tmp_path, env)
    assert done.returncode == 0, done.stdout + done.stderr
    committed = run_shell("git show --name-only --format=%s HEAD", tmp_path, env).stdout.split()
    assert committed[-2:] == ["kv-baseline.json", "my_caches.py"] and "baseline" in committed, committed


CUT = re.compile(r"^\.\.\. (\d+) lines? left out: \S")


def cuts_problems(sample: list[str], whole: list[str]) -> list[str]:
    """How ``sample`` fails to be ``whole`` with marked cuts: every line of the sample is the next line of the whole
    or a ``... N lines left out: what`` line standing for exactly the N lines it skips."""
    problems, at = [], 0
    for line in sample:
        cut = CUT.match(line)
        if cut:
            at += int(cut.group(1))
        elif at < len(whole) and whole[at] == line:
            at += 1
        else:
            problems.append(f"not the next line of the output ({whole[at] if at < len(whole) else 'its end'!r}): "
                            f"{line!r}")
            break
    if not problems and at != len(whole):
        problems.append(f"the sample stops at line {at} of {len(whole)} without a cut saying so")
    return problems


def test_cuts_are_found_unmarked_and_miscounted():
    whole = ["a", "b", "c", "d"]
    assert cuts_problems(["a", "... 2 lines left out: b, c", "d"], whole) == []
    assert cuts_problems(["a", "c", "d"], whole)  # b dropped silently
    assert cuts_problems(["a", "... 1 line left out: b", "d"], whole)  # miscounted
    assert cuts_problems(["a", "b"], whole)  # the end dropped silently


def test_readme_make_bench_sample_is_the_real_output_with_marked_cuts():
    """The README's make bench sample is results.md's whole output of that run with every cut marked: a ``...``
    line saying how many lines it leaves out and which, never a line, a table rule or a note dropped silently."""
    from test_docs import block

    sample = block("README.md", "... 1 line left out: the device").text.splitlines()
    whole = block("docs/results.md", "device cpu: AMD EPYC (1 threads); transformers 5.24.0").text.splitlines()
    assert whole[-1].startswith("=") and sample[1] in whole  # the same run
    assert cuts_problems(sample, whole) == []
