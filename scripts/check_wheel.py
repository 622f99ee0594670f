"""The package as a user gets it: build the sdist and the wheel (or take them from ``--dist``), check their metadata
and contents, install the wheel into a clean virtual environment and run the README's "Gate your own cache class"
steps against it from outside this repository; each failure one line, exit 1 (docs/running.md)::

    python scripts/check_wheel.py [--dist DIR] (--venv DIR | --reuse-site-packages PYTHON)"""

from __future__ import annotations

import argparse
import email.parser
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NAME = "kvcache-passes"
EXTRAS = ("bench", "report", "quantized", "test")
# where a checkout's folders land in the wheel (pyproject.toml's package-dir)
WHEEL_PLACES = {"kvcache": "kvcache", "benchmarks": "kvcache/benchmarks"}
ENTRY_POINTS = ("[pytest11]", "kvcache.plugin = kvcache.plugin", "[console_scripts]", "kvcache = kvcache.cli:main")
TIMEOUT_S = 900


class CheckFailed(Exception):
    """One line: what is wrong."""


def run(cmd: list[str], **kwargs) -> subprocess.CompletedProcess:
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT_S, **kwargs)
    if done.returncode != 0:
        raise CheckFailed(f"{' '.join(map(str, cmd))} exited {done.returncode}:\n{done.stdout}{done.stderr}")
    return done


def shipped_sources() -> list[str]:
    """The files of ``kvcache/`` and ``benchmarks/`` a checkout holds (tracked, or new and not ignored)."""
    listed = run(["git", "ls-files", "-co", "--exclude-standard", "--", *WHEEL_PLACES], cwd=ROOT).stdout.split()
    return sorted(f for f in listed if (ROOT / f).is_file())


# --- 1. build ---------------------------------------------------------------------------------------------------

def build(out: Path) -> list[Path]:
    """The sdist and the wheel, built by setuptools from a copy of the checkout's files (nothing is written into the
    checkout): ``python -m build`` where it is installed, else setuptools' build hooks in this interpreter."""
    src = out / "src"
    files = run(["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT).stdout.split()
    for name in files:
        if (ROOT / name).is_file():
            (src / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, src / name)
    dist = out / "dist"
    try:
        import build  # noqa: F401
    except ImportError:  # a process per hook: setuptools 84 run in one process put the wheel into src/sdist/
        for hook in ("build_sdist", "build_wheel"):
            code = f"import sys; from setuptools import build_meta as b; b.{hook}(sys.argv[1])"
            run([sys.executable, "-c", code, str(dist)], cwd=src)
    else:
        run([sys.executable, "-m", "build", "--outdir", str(dist), str(src)])
    return distributions(dist)


def distributions(dist: Path) -> list[Path]:
    found = sorted([*dist.glob("*.whl"), *dist.glob("*.tar.gz")])
    if len([p for p in found if p.suffix == ".whl"]) != 1 or len([p for p in found if p.suffix == ".gz"]) != 1:
        raise CheckFailed(f"expected one wheel and one sdist in {dist}, found {[p.name for p in found]}")
    return found


# --- 2. metadata and contents -----------------------------------------------------------------------------------

def read_metadata(path: Path) -> tuple[email.message.Message, list[str], str]:
    """(METADATA or PKG-INFO, the names of the files inside, entry_points.txt or '')."""
    if path.suffix == ".whl":
        with zipfile.ZipFile(path) as z:
            names = z.namelist()
            meta = next(n for n in names if n.endswith(".dist-info/METADATA"))
            points = next((n for n in names if n.endswith(".dist-info/entry_points.txt")), None)
            return (email.parser.Parser().parsestr(z.read(meta).decode()), names,
                    z.read(points).decode() if points else "")
    with tarfile.open(path) as t:
        names = [m.name.split("/", 1)[1] for m in t.getmembers() if "/" in m.name]
        top = t.getmembers()[0].name.split("/")[0]
        info = t.extractfile(f"{top}/PKG-INFO")
        return email.parser.Parser().parsestr(info.read().decode()), names, ""


def check_metadata(path: Path) -> str:
    """The distribution's version, after checking what an index and a user rely on."""
    meta, _, points = read_metadata(path)
    problems = []
    if meta.get("Name", "").replace("_", "-").lower() != NAME:
        problems.append(f"Name is {meta.get('Name')!r}, not {NAME!r}")
    for field in ("Version", "Summary", "Requires-Python"):
        if not meta.get(field):
            problems.append(f"no {field}")
    if meta.get("Description-Content-Type", "") != "text/markdown":
        problems.append(f"Description-Content-Type is {meta.get('Description-Content-Type')!r}, not text/markdown")
    if "# kvcache-passes" not in (meta.get_payload() or meta.get("Description", "")):
        problems.append("the README is not its long description")
    missing = [e for e in EXTRAS if e not in meta.get_all("Provides-Extra", [])]
    if missing:
        problems.append(f"extras missing: {', '.join(missing)}")
    if path.suffix == ".whl":
        for needed in ENTRY_POINTS:
            if needed not in points:
                problems.append(f"entry_points.txt lacks {needed!r}")
    if problems:
        raise CheckFailed(f"{path.name}: " + "; ".join(problems))
    return meta["Version"]


def check_contents(path: Path, sources: list[str]) -> None:
    """Every shipped source file of the checkout is in the distribution, at its place."""
    _, names, _ = read_metadata(path)
    inside = set(names)
    if path.suffix == ".whl":
        wanted = {f: WHEEL_PLACES[f.split("/")[0]] + f[len(f.split("/")[0]):] for f in sources}
    else:
        wanted = {f: f for f in sources}
    missing = sorted(f for f, place in wanted.items() if place not in inside)
    if missing:
        raise CheckFailed(f"{path.name} lacks {len(missing)} file(s) of the checkout: {', '.join(missing)}")


def twine_check(paths: list[Path]) -> str:
    if shutil.which("twine") is None and subprocess.run([sys.executable, "-c", "import twine"],
                                                        capture_output=True).returncode != 0:
        return "twine not installed: metadata read by this script only"
    run([sys.executable, "-m", "twine", "check", "--strict", *map(str, paths)])
    return "twine check --strict: passed"


# --- 3. the clean environment -----------------------------------------------------------------------------------

def clean_environment(venv: Path, wheel: Path, reuse_from: str | None) -> Path:
    """The virtual environment's ``bin``, the wheel installed in it."""
    python = venv / "bin" / "python"
    if reuse_from is not None:
        run([sys.executable, "-m", "venv", str(venv)])
        code = "import sys; print(*(p for p in sys.path if p.endswith(('site-packages', 'dist-packages'))))"
        paths = run([str(Path(reuse_from).absolute()), "-c", code], cwd=tempfile.gettempdir()).stdout.split()
        own = run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).stdout.strip()
        Path(own, "zz_reused_site_packages.pth").write_text("".join(p + "\n" for p in paths))
        run([str(python), "-m", "pip", "install", "-q", "--no-deps", str(wheel)])
    else:
        if not python.exists():
            run([sys.executable, "-m", "venv", str(venv)])
        run([str(python), "-m", "pip", "install", "-q", f"{wheel}[bench,report]"])
    return python.parent


# --- 4. the README's steps --------------------------------------------------------------------------------------

def readme_steps(readme: Path = ROOT / "README.md") -> dict[str, str]:
    """The "Gate your own cache class" section's code: ``caches`` (step 1's Python), ``baseline`` (step 2's
    command), ``commit`` (step 3's), ``gate`` (the last ``run:`` of step 4's workflow)."""
    text = readme.read_text(encoding="utf-8")
    section = text.split("## Gate your own cache class", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```(\w*)\n(.*?)```", section, flags=re.S)
    python = [body for lang, body in blocks if lang == "python"]
    shell = [body.strip() for lang, body in blocks if lang in ("sh", "bash")]
    workflow = [body for lang, body in blocks if lang in ("yaml", "yml")]
    if len(python) != 1 or len(shell) != 2 or len(workflow) != 1:
        raise CheckFailed("README.md's 'Gate your own cache class' no longer has one python, two sh and one yaml "
                          f"block (found {len(python)}, {len(shell)}, {len(workflow)}): update {Path(__file__).name}")
    runs = re.findall(r"^\s*- run: (.+)$", workflow[0], flags=re.M)
    return {"caches": python[0], "baseline": shell[0], "commit": shell[1], "gate": runs[-1].strip()}


def run_readme_steps(bin_dir: Path, reused: bool) -> list[str]:
    """Steps 1-4 in a new directory outside the repository; what each showed."""
    steps = readme_steps()
    shown = []
    with tempfile.TemporaryDirectory(prefix="kvcache-user-") as tmp:
        user = Path(tmp)
        if user.resolve().is_relative_to(ROOT):
            raise CheckFailed(f"{user} lies inside the repository")
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "PYTEST_", "VIRTUAL_ENV"))}
        env.update(PATH=os.pathsep.join([str(bin_dir), env.get("PATH", "")]), HF_HUB_OFFLINE="1",
                   PYTEST_ADDOPTS="-p no:cacheprovider --kv-model tiny", GIT_AUTHOR_NAME="check",
                   GIT_AUTHOR_EMAIL="check@localhost", GIT_COMMITTER_NAME="check",
                   GIT_COMMITTER_EMAIL="check@localhost")
        env.setdefault("OMP_NUM_THREADS", "1")

        def shell(command: str) -> str:
            done = subprocess.run(["bash", "-c", command], cwd=user, env=env, capture_output=True, text=True,
                                  timeout=TIMEOUT_S)
            if done.returncode != 0:
                raise CheckFailed(f"README step `{command}` exited {done.returncode}:\n{done.stdout}{done.stderr}")
            return done.stdout + done.stderr

        where = shell("python -c 'import kvcache, kvcache.benchmarks as b; print(kvcache.__file__); print(b.__file__)'")
        venv = bin_dir.parent.resolve()
        for line in where.split():
            if not Path(line).resolve().is_relative_to(venv):
                raise CheckFailed(f"kvcache imported from {line}, not from the clean environment {venv}")
        (user / "my_caches.py").write_text(steps["caches"])
        out = shell(steps["baseline"])
        for cache in ("dynamic", "mine"):
            if f"counted {cache}: 3.000 passes" not in out:
                raise CheckFailed(f"step 2 did not print 'counted {cache}: 3.000 passes':\n{out}")
        if not (user / "kv-baseline.json").is_file():
            raise CheckFailed(f"step 2 wrote no kv-baseline.json in the user's directory:\n{out}")
        shown.append("step 2: counted dynamic 3.000, mine 3.000 passes; kv-baseline.json written")
        shell("git init -q")
        shell(steps["commit"])
        shown.append("step 3: committed")
        out = shell(steps["gate"] + " --benchmark-json run.json")
        if not re.search(r"^mine\s+pass\b", out, flags=re.M):
            raise CheckFailed(f"step 4's gate did not give mine the counted verdict pass:\n{out}")
        shown.append("step 4: the gate passes, counted verdict for mine: pass")
        report = "kvcache report run.json --out report"
        shell(report)
        page = (user / "report" / "report.html").read_text(encoding="utf-8")
        if "<style" not in page or "<script" not in page:
            raise CheckFailed("report.html lacks its inlined CSS or JS")
        shown.append(f"`{report}`: report.html with its CSS and JS" + (" (PNGs: matplotlib reused)" if reused else ""))
    return shown


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dist", type=Path, help="take the sdist and the wheel from here instead of building them")
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--venv", type=Path, help="install the wheel with its bench extra into this environment")
    where.add_argument("--reuse-site-packages", metavar="PYTHON",
                       help="a new environment that reaches PYTHON's site-packages; the wheel with --no-deps")
    args = parser.parse_args(argv)
    try:
        with tempfile.TemporaryDirectory(prefix="kvcache-wheel-") as tmp:
            found = distributions(args.dist) if args.dist else build(Path(tmp))
            print("built:" if not args.dist else "taken:", ", ".join(p.name for p in found))
            versions = {check_metadata(p) for p in found}
            if len(versions) != 1:
                raise CheckFailed(f"the sdist and the wheel disagree on the version: {sorted(versions)}")
            print(f"metadata: {NAME} {versions.pop()}; {twine_check(found)}")
            sources = shipped_sources()
            for path in found:
                check_contents(path, sources)
            print(f"contents: all {len(sources)} files of kvcache/ and benchmarks/ in both")
            wheel = next(p for p in found if p.suffix == ".whl")
            venv = args.venv or Path(tmp) / "venv"
            bin_dir = clean_environment(venv, wheel, args.reuse_site_packages)
            for line in run_readme_steps(bin_dir, args.reuse_site_packages is not None):
                print(line)
    except CheckFailed as exc:
        print(f"check_wheel: {exc}", file=sys.stderr)
        return 1
    print("check_wheel: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
