"""``kvcache ab``: two environments measured side by side in one session, B judged against A from paired points.

    kvcache ab [--a-env NAME=VALUE ...] [--b-env NAME=VALUE ...] [--a-args "..."] [--b-args "..."]
               [--a-release X] [--b-release Y] [--versions-dir .versions] [--out-dir DIR] [--json OUT]
               [--tolerance 0.10] [-- COMMON PYTEST OPTIONS]

Each side is one worker process, ``python -m pytest --pyargs kvcache.benchmarks -p kvcache.ab_worker COMMON
SIDE-ARGS`` with the side's environment (this one's, plus its ``--x-env``; ``--x-release`` puts that Transformers
release, installed side by side into ``--versions-dir`` by :mod:`kvcache.releases`, first on ``PYTHONPATH``). It is
the suite as that side's own ``pytest`` runs it (its ``-p`` plugins, conftest files and Transformers), up for the
whole session: one model build per side. This command steps the two through the suite's items in the suite's own
order (:mod:`kvcache.ab_worker`): counted items on both sides at once (exact figures: time does not matter), and
every other item (each round's copy bandwidth, each timed point, each profiled ledger point, the drift
re-measurement) on one side and then on the other, back to back, in ABBA order (which side goes first alternates
from one item to the next). Classes are paired by name (a side that patches one registers it under the same name,
``replace=True``). Budget: the items, rounds and steps of one sweep (the common options), shared by both sides, so
an A/B takes about twice one run of the same options, less the counted part, which the sides run at once.

Each side's records come back item by item and are analysed here (:mod:`kvcache.analysing.analysis`, no torch)
into that side's ``kv`` section; :mod:`kvcache.analysing.ab` judges B against A. Each worker's output goes to
``--out-dir/a.log`` and ``b.log``.

Output: a summary like ``kvcache compare``'s, and with ``--json OUT`` one file that ``kvcache compare``, ``kvcache
report`` and ``kvcache comment --ab`` read: pytest-benchmark-shaped with side B's ``kv`` section, side A's whole
run under ``side_a``, the paired verdicts under ``ab`` (``ab.<cache>.timed``, ``.intercept``, ``.ledger.<op>``,
``.counted``, ``.overhead``) and the session under ``ab_run`` (sides, pairs in order, drift and copy bandwidth per
side, which side failed).

Bad input (one line, exit 2, before anything is measured): a malformed option, a release that cannot be
installed, a side whose environment cannot run the suite (its log's last line is quoted), sides that differ in
model, dtype, device, threads, driver, batch, ragged or compile, or collected different items. Releases, torch,
patches, plug-ins and environment variables may differ: that is what the sides are for.

If a worker dies, or on Ctrl-C or SIGTERM, both workers are ended at once (an item in flight makes no pair), every
item both sides finished is kept and judged, and the output says which side failed. Exit status: 0 no regression,
1 a regression (paired timed, or counted/overhead), 2 bad input, 3 a side failed part-way (what both finished is
judged; a regression there is still 1), 130 interrupted.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import selectors
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import IO, Any

EXIT_OK, EXIT_REGRESSION, EXIT_USAGE, EXIT_SIDE_FAILED, EXIT_INTERRUPTED = 0, 1, 2, 3, 130
FORMAT = 1
#: Identity fields that must match between the sides: (label, where in the worker's hello, default).
MUST_MATCH = (("model", ("settings", "model"), None), ("dtype", ("settings", "dtype"), None),
              ("device", ("environment", "device_name"), None), ("threads", ("environment", "threads"), None),
              ("driver", ("settings", "driver"), "loop"), ("batch", ("settings", "batch"), 1),
              ("ragged", ("settings", "ragged"), False), ("compile", ("settings", "compile"), "off"))
CONCURRENT_ROLES = ("counted", "other")  # items whose figures do not depend on time: both sides at once
#: Options an A/B run refuses in the sides' pytest arguments, and why.
REFUSED = {"--kv-update-baseline": "an A/B records no baseline (record one with a plain run)",
           "--benchmark-json": "each side's run comes back to this command: use --json",
           "-n": "the sides take turns on the machine; pytest-xdist workers would time each other",
           "--numprocesses": "the sides take turns on the machine; pytest-xdist workers would time each other",
           "--kv-ab-control": "this command sets it"}
STOP_WAIT = 120  # seconds a worker gets to end its session after its last item before it is killed


class ABError(Exception):
    """Bad input; the message is one line."""


class Interrupted(Exception):
    """SIGINT or SIGTERM reached this process."""


def one_line(text: str, limit: int = 300) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return (lines[-1] if lines else "(no output)")[:limit]


@dataclass
class Side:
    """One worker: its name (``a``/``b``), environment, pytest arguments, and what it has sent back."""

    name: str
    env: dict[str, str]
    args: list[str]
    log: Path
    release: str | None = None
    proc: subprocess.Popen | None = None
    answers: IO[str] | None = None
    requests: IO[str] | None = None
    hello: dict[str, Any] = field(default_factory=dict)
    records: list[dict[str, Any]] = field(default_factory=list)
    finished: list[str] = field(default_factory=list)
    failure: str | None = None

    @property
    def label(self) -> str:
        return self.name.upper()

    def start(self, common: list[str], cwd: Path) -> None:
        req_r, req_w = os.pipe()
        ans_r, ans_w = os.pipe()
        cmd = [sys.executable, "-m", "pytest", "--pyargs", "kvcache.benchmarks", "-p", "no:cacheprovider", "-q",
               "-p", "kvcache.ab_worker", "--kv-ab-control", f"{req_r},{ans_w}", *common, *self.args]
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with self.log.open("w") as log:
            log.write("$ " + shlex.join(cmd) + "\n")
            log.flush()
            self.proc = subprocess.Popen(cmd, cwd=cwd, env=self.env, stdin=subprocess.DEVNULL, stdout=log,
                                         stderr=subprocess.STDOUT, pass_fds=(req_r, ans_w),
                                         start_new_session=True)  # Ctrl-C reaches this driver only
        os.close(req_r)
        os.close(ans_w)
        self.answers = os.fdopen(ans_r, "r")
        self.requests = os.fdopen(req_w, "w", buffering=1)

    def read(self) -> dict[str, Any] | None:
        """The worker's next message; None when it is gone (its pipe closed)."""
        assert self.answers is not None
        line = self.answers.readline()
        if not line:
            return None
        return json.loads(line)

    def tell(self, word: str) -> None:
        try:
            assert self.requests is not None
            self.requests.write(word + "\n")
            self.requests.flush()
        except (OSError, ValueError):
            pass  # already gone

    def exit_text(self) -> str:
        if self.proc is None:
            return "not started"
        try:
            code = self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            return "still running"
        return f"killed by {signal.Signals(-code).name}" if code < 0 else f"exit {code}"

    def last_log_line(self) -> str:
        try:
            text = self.log.read_text(errors="replace")
        except OSError:
            return "(no log)"
        lines = [line for line in text.splitlines()[1:] if line.strip() and not set(line.strip()) <= set("=-_")]
        errors = [line for line in lines if line.lstrip().startswith(("ERROR", "E ", "ModuleNotFoundError",
                                                                     "ImportError"))]
        return one_line("\n".join(errors[-1:] or lines[-1:]) or "(empty log)")

    def finish(self) -> None:
        """After its last item: let the worker end its session (its log's summary); kill it if it has not exited in
        :data:`STOP_WAIT` seconds."""
        if self.proc is None:
            return
        self.tell("stop")
        try:
            self.proc.wait(timeout=STOP_WAIT)
        except subprocess.TimeoutExpired:
            self.kill()
        self.close()

    def kill(self) -> None:
        """End the worker now (bad input, a failure or an interruption: what it finished has already come back; an
        item in flight is not a pair). A worker whose driver is gone stops by itself at its next item (its pipe
        closes)."""
        if self.proc is not None and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait()
        self.close()

    def close(self) -> None:
        for stream in (self.answers, self.requests):
            try:
                if stream is not None:
                    stream.close()
            except OSError:
                pass


# --- arguments --------------------------------------------------------------------------------------------------


def parse_env(values: list[str] | None, option: str) -> dict[str, str]:
    out = {}
    for value in values or []:
        name, sep, text = value.partition("=")
        if not sep or not name or not name.replace("_", "").isalnum() or name[0].isdigit():
            raise ABError(f"{option} {value!r}: expected NAME=VALUE (e.g. PYTHONPATH=.versions/5.22.2)")
        out[name] = text
    return out


def split_args(text: str | None, option: str) -> list[str]:
    try:
        args = shlex.split(text or "")
    except ValueError as exc:
        raise ABError(f"{option} {text!r}: {exc}") from None
    return args


def refused(args: list[str], where: str) -> None:
    for arg in args:
        name = arg.split("=", 1)[0]
        if name.startswith("-n") and name[2:].isdigit():
            name = "-n"
        if name in REFUSED:
            raise ABError(f"{where}: {name} is not allowed in an A/B run ({REFUSED[name]})")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="kvcache ab", description="Measure two environments side by side in one session (interleaved, ABBA) "
        "and judge B against A from paired points: timed passes, intercept and per-op ledger by the B/A ratio with "
        "a paired bootstrap interval; counted passes and overhead by compare's judge. Exit 0 no regression, 1 a "
        "regression, 2 bad input, 3 a side failed part-way, 130 interrupted. Common pytest options go after --.")
    for side in ("a", "b"):
        p.add_argument(f"--{side}-env", action="append", metavar="NAME=VALUE",
                       help=f"an environment variable of side {side.upper()} (repeatable)")
        p.add_argument(f"--{side}-args", metavar="ARGS", help=f"pytest arguments of side {side.upper()} only, "
                       "e.g. \"-p mypatch\"")
        p.add_argument(f"--{side}-release", metavar="VERSION", help=f"side {side.upper()} on this Transformers "
                       "release, installed side by side into --versions-dir")
    p.add_argument("--versions-dir", default=".versions", help="where releases are installed (default .versions)")
    p.add_argument("--out-dir", default=".kvcache-ab", help="each side's log (a.log, b.log; default .kvcache-ab)")
    p.add_argument("--json", metavar="OUT", help="write both sides' runs and the paired verdicts to OUT")
    p.add_argument("--tolerance", default="0.10", help="allowed B/A ratio above 1 (default 0.10: ×1.10); "
                   "improvement below 1/(1 + tolerance)")
    return p


def build_sides(args: argparse.Namespace, out_dir: Path, say: Any) -> list[Side]:
    from kvcache import releases as installer

    own = _own_transformers()
    sides = []
    for name in ("a", "b"):
        env = {**os.environ, **parse_env(getattr(args, f"{name}_env"), f"--{name}-env")}
        side_args = split_args(getattr(args, f"{name}_args"), f"--{name}-args")
        refused(side_args, f"--{name}-args")
        release = getattr(args, f"{name}_release")
        if release:
            try:
                release, note = installer.normalise(release)
            except installer.ReleaseError as exc:
                raise ABError(f"--{name}-release: {exc}") from None
            if note:
                say(f"--{name}-release: {note}")
            if release != own:
                say(f"side {name.upper()}: transformers {release} (installing into {args.versions_dir} if needed)")
                with (out_dir / f"{name}-install.log").open("w") as log:
                    try:
                        target = installer.ensure(release, Path(args.versions_dir), log)
                    except installer.ReleaseError as exc:
                        raise ABError(f"--{name}-release {release}: {exc} (see {out_dir / f'{name}-install.log'})"
                                      ) from None
                env = installer.release_env(target, env)
        sides.append(Side(name, env, side_args, out_dir / f"{name}.log", release=release))
    return sides


def _own_transformers() -> str | None:
    try:
        return metadata.version("transformers")
    except metadata.PackageNotFoundError:
        return None


def _get(doc: dict[str, Any], path: tuple[str, ...], default: Any) -> Any:
    for key in path:
        doc = doc.get(key) if isinstance(doc, dict) else None
    return default if doc is None else doc


def identity_problem(a: dict[str, Any], b: dict[str, Any]) -> str | None:
    """The identity fields on which the two workers' hellos differ, or None."""
    differ = [f"{label} (A: {_get(a, path, d)}, B: {_get(b, path, d)})" for label, path, d in MUST_MATCH
              if _get(a, path, d) != _get(b, path, d)]
    if not differ:
        return None
    return ("the sides differ in " + "; ".join(differ) + ": an A/B compares environments on one identity (releases, "
            "torch, patches, plug-ins and environment variables may differ)")


# --- the session ------------------------------------------------------------------------------------------------


@dataclass
class Session:
    sides: list[Side]
    pairs: list[dict[str, Any]] = field(default_factory=list)
    interrupted: str | None = None
    roles: list[str] = field(default_factory=list)
    items: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def _on_signal(signum: int, frame: Any) -> None:
    raise Interrupted(signal.Signals(signum).name)


def start(session: Session, common: list[str], cwd: Path) -> None:
    """Start both workers and read their hellos; ABError when a side cannot run the suite or the sides differ."""
    for side in session.sides:
        side.start(common, cwd)
    waiting = {side.answers.fileno(): side for side in session.sides if side.answers is not None}
    with selectors.DefaultSelector() as selector:  # whichever answers first: a side that fails is said at once
        for fd in waiting:
            selector.register(fd, selectors.EVENT_READ)
        while waiting:
            for key, _ in selector.select():
                side = waiting.pop(key.fd)
                selector.unregister(key.fd)
                message = side.read()
                if message is None or "hello" not in message:
                    raise ABError(f"side {side.label} cannot run the suite ({side.exit_text()}): "
                                  f"{side.last_log_line()} (see {side.log})")
                side.hello = message["hello"]
    a, b = (side.hello for side in session.sides)
    if not a.get("items"):
        raise ABError(f"side A collected no item of the suite (see {session.sides[0].log})")
    problem = identity_problem(a, b)
    if problem:
        raise ABError(problem)
    if a["items"] != b["items"]:
        only = sorted(set(a["items"]) ^ set(b["items"]))[:3]
        raise ABError(f"the sides collected different items ({', '.join(only) or 'in another order'}): give both "
                      "the same common options")
    session.items, session.roles = a["items"], a.get("roles") or ["point"] * len(a["items"])


def run_item(side: Side, nodeid: str) -> bool:
    """Let ``side`` run ``nodeid``; False (and ``side.failure`` set) when the worker is gone."""
    message = side.read()
    if message is None or message.get("ready") != nodeid:
        side.failure = side.failure or f"worker {side.exit_text()} before {nodeid} (see {side.log})"
        return False
    side.tell("go")
    return finish_item(side, nodeid)


def finish_item(side: Side, nodeid: str) -> bool:
    message = side.read()
    if message is None or message.get("done") != nodeid:
        side.failure = f"worker {side.exit_text()} during {nodeid} (see {side.log}: {side.last_log_line()})"
        return False
    side.records += message.get("records") or []
    side.finished.append(nodeid)
    return True


def drive(session: Session, say: Any) -> None:
    """Step both workers through every item (see the module docstring); stops at the first failure."""
    a, b = session.sides
    for side in session.sides:
        side.tell("go")  # past the hello
    k = 0
    for nodeid, role in zip(session.items, session.roles):
        if role in CONCURRENT_ROLES:
            ready = [side.read() for side in (a, b)]
            for side, message in zip((a, b), ready):
                if message is None or message.get("ready") != nodeid:
                    side.failure = f"worker {side.exit_text()} before {nodeid} (see {side.log})"
                    return
            for side in (a, b):
                side.tell("go")
            if not all([finish_item(a, nodeid), finish_item(b, nodeid)]):
                return
            session.pairs.append({"item": nodeid, "role": role, "first": None})
            continue
        order = (a, b) if k % 2 == 0 else (b, a)
        k += 1
        for side in order:
            if not run_item(side, nodeid):
                return
        session.pairs.append({"item": nodeid, "role": role, "first": order[0].name})
        say(f"  {len(session.pairs)}/{len(session.items)} {nodeid} ({order[0].label}{order[1].label})")


# --- results ----------------------------------------------------------------------------------------------------


def side_kv(side: Side, interrupted: bool, exit_text: str) -> dict[str, Any]:
    from kvcache.analysing import analysis

    settings = side.hello.get("settings") or {}
    return analysis.analyse(side.records, settings, side.hello.get("baseline") or {},
                            {"interrupted": interrupted, "exit": exit_text, "failed": []})


def _run_of(kv: dict[str, Any], path: str) -> Any:
    from kvcache.analysing.records import KV, Run

    points = [p.to_point() for p in KV.from_json(kv, path).points if p.samples_ms is not None]
    return Run(path=path, points=points, kv=kv, machine_info={"kv_environment": kv.get("environment")})


def results(session: Session, tolerance: float) -> dict[str, Any]:
    """The output document (see the module docstring)."""
    from kvcache.analysing import ab as judge
    from kvcache.analysing import compare

    a, b = session.sides
    broken = [side for side in session.sides if side.failure]
    interrupted = bool(session.interrupted or broken)
    exit_text = (f"interrupted by {session.interrupted}" if session.interrupted else
                 f"side {broken[0].label} failed" if broken else "ok")
    kv_a, kv_b = side_kv(a, interrupted, exit_text), side_kv(b, interrupted, exit_text)
    run_a, run_b = _run_of(kv_a, "A"), _run_of(kv_b, "B")
    try:
        counted = compare.judge_against(run_b, run_a, compare.rules_of(run_b))
    except Exception as exc:  # noqa: BLE001 - the paired verdicts stand on their own; say why these are missing
        counted = {}
        session.notes.append(f"counted and overhead not judged: {exc}")
    verdicts = judge.judge(kv_a, kv_b, tolerance=tolerance, counted=counted,
                           seed=int((kv_b.get("settings") or {}).get("seed", 0)))
    now = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")

    def described(side: Side) -> dict[str, Any]:
        env = side.hello.get("environment") or {}
        copies = [{"label": m.get("label"), "gbps": m.get("gbps")}
                  for m in ((side_kvs[side.name].get("copy") or {}).get("measurements") or [])]
        return {"args": side.args, "release": side.release, "transformers": env.get("transformers"),
                "torch": env.get("torch"), "log": str(side.log), "failed": side.failure,
                "items_finished": len(side.finished), "drift": judge.drift_of(side_kvs[side.name]),
                "copy": copies}
    side_kvs = {"a": kv_a, "b": kv_b}
    run = {"format": FORMAT, "tolerance": tolerance, "interrupted": session.interrupted,
           "failed": [side.name for side in broken], "items": len(session.items), "pairs": session.pairs,
           "sides": {side.name: described(side) for side in session.sides},
           "notes": session.notes}
    return {"benchmarks": [], "machine_info": {"kv_environment": kv_b.get("environment")}, "commit_info": {},
            "datetime": now, "version": None, "kv": kv_b, "ab": verdicts, "ab_run": run,
            "side_a": {"benchmarks": [], "machine_info": {"kv_environment": kv_a.get("environment")},
                       "datetime": now, "kv": kv_a}}


def summary(doc: dict[str, Any]) -> list[str]:
    """The terminal summary: sides, drift and copy bandwidth per side, the verdict table, failures."""
    from kvcache.analysing import ab as judge
    from kvcache.analysing import tables

    run = doc["ab_run"]
    lines = ["kvcache ab: B against A, points paired back to back (ABBA)"]
    for name, side in run["sides"].items():
        drift = side.get("drift")
        copies = [c["gbps"] for c in side.get("copy") or [] if c.get("gbps") is not None]
        copy = f"copy {min(copies):.1f}-{max(copies):.1f} GB/s" if copies else "copy —"
        lines.append(f"  {name.upper()}: transformers {side.get('transformers')}, torch {side.get('torch')}"
                     + (f", args {shlex.join(side['args'])}" if side.get("args") else "")
                     + f"; drift {'—' if drift is None else format(drift, '+.1%')}; {copy}"
                     + (f"; FAILED: {side['failed']}" if side.get("failed") else ""))
    done = len(run["pairs"])
    lines.append(f"  {done}/{run['items']} items finished on both sides; tolerance ×{1 + run['tolerance']:.2f}")
    table = tables.Table(["class", "measure", "A", "B", "B/A [interval]", "verdict"], judge.summary_rows(doc["ab"]))
    lines += ["", *tables.text(table)]
    for cache, measure, v in judge.statuses(doc["ab"]):
        if v.get("status") in ("regression", "inconclusive") and not measure.startswith("ledger."):
            lines.append(f"{v['status']}: {cache} {measure}: {v.get('reason', '')}")
    lines += run.get("notes") or []
    if run.get("interrupted"):
        lines.append(f"interrupted by {run['interrupted']}: the {done} finished pairs are kept")
    for name in run.get("failed") or []:
        lines.append(f"side {name.upper()} failed: {run['sides'][name]['failed']}; the {done} finished pairs "
                     "are kept")
    return lines


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    common: list[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, common = argv[:cut], argv[cut + 1:]
    try:
        args = parser().parse_args(argv)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE

    def say(text: str) -> None:
        print(text, file=sys.stderr, flush=True)

    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    session: Session | None = None
    try:
        try:
            tolerance = float(args.tolerance)
            if not tolerance >= 0 or tolerance == float("inf"):
                raise ValueError
        except ValueError:
            raise ABError(f"--tolerance {args.tolerance!r}: expected a number of 0 or more (e.g. 0.10)") from None
        refused(common, "the common options (after --)")
        out_dir = Path(args.out_dir)
        if args.json:
            from kvcache.analysing import files

            problem = files.write_problem(Path(args.json))
            if problem:
                raise ABError(f"--json {problem}")
        out_dir.mkdir(parents=True, exist_ok=True)
        for sig in previous:
            signal.signal(sig, _on_signal)
        session = Session(build_sides(args, out_dir, say))
        started = time.monotonic()
        start(session, common, Path.cwd())
        say(f"kvcache ab: {len(session.items)} items, each side's log in {out_dir}/")
        drive(session, say)
    except ABError as exc:
        if session is not None:
            for side in session.sides:
                side.kill()
        print(f"kvcache ab: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except Interrupted as exc:
        if session is None:
            return EXIT_INTERRUPTED
        session.interrupted = str(exc)
        say(f"kvcache ab: {exc}: stopping both sides, keeping the finished pairs")
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    assert session is not None
    try:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # the results are written whatever arrives now
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        for side in session.sides:
            side.kill() if (session.interrupted or any(x.failure for x in session.sides)) else side.finish()
        if not session.items:  # interrupted before the workers said hello: nothing was measured
            return EXIT_INTERRUPTED
        doc = results(session, tolerance)
        doc["ab_run"]["seconds"] = round(time.monotonic() - started, 1)
        if args.json:
            from kvcache.analysing import files
            from kvcache.analysing.records import jsonable

            files.write_text_atomically(args.json, json.dumps(jsonable(doc), indent=1))
        for line in summary(doc):
            print(line, flush=True)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    from kvcache.analysing import ab as judge

    if judge.regressions(doc["ab"]):
        return EXIT_REGRESSION
    if session.interrupted:
        return EXIT_INTERRUPTED
    if any(side.failure for side in session.sides):
        return EXIT_SIDE_FAILED
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
