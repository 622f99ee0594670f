"""The two sides of ``kvcache ab``: each is one worker process (``python -m pytest --pyargs kvcache.benchmarks -p
kvcache.ab.worker ...``, :mod:`kvcache.ab.worker`) with its own environment and pytest arguments, and the two pipes
this driver steps it through; :func:`build_sides` makes them from the command's options (installing a side's
``--x-release`` first). Standard library only."""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import IO, Any, Callable

from kvcache.analysing.records.context import Environment, RunSettings
from kvcache.analysing.records.file_formats import BaselineFile
from kvcache.cli import last_line

STOP_WAIT = 120  # seconds a worker gets to end its session after its last item before it is killed
#: Options an A/B run refuses in the sides' pytest arguments, and why.
REFUSED = {"--kv-update-baseline": "an A/B records no baseline (record one with a plain run)",
           "--benchmark-json": "each side's run comes back to this command: use --json",
           "-n": "the sides take turns on the machine; pytest-xdist workers would time each other",
           "--numprocesses": "the sides take turns on the machine; pytest-xdist workers would time each other",
           "--kv-ab-control": "this command sets it"}


class ABError(Exception):
    """Bad input; the message is one line."""


@dataclass
class Hello:
    """A worker's first message (:mod:`kvcache.ab.worker`): its items in measuring order and their roles
    (``counted``, ``point``, ``copy``, ``ledger``, ``drift``...), its ``kv.settings``, ``kv.environment`` and
    baseline."""

    items: list[str] = field(default_factory=list)
    roles: list[str] = field(default_factory=list)
    settings: RunSettings = field(default_factory=RunSettings)
    environment: Environment = field(default_factory=Environment)
    baseline: BaselineFile | None = None

    @classmethod
    def from_message(cls, hello: dict[str, Any]) -> Hello:
        """The hello as the worker sends it (every key, :func:`kvcache.ab.worker.pytest_collection_finish`); KeyError
        when one is missing; RecordError when its settings or environment is not an object."""
        return cls(items=hello["items"], roles=hello["roles"],
                   settings=RunSettings.from_json(hello["settings"], "hello settings"),
                   environment=Environment.from_json(hello["environment"], "hello environment"),
                   baseline=BaselineFile.from_json(hello["baseline"], "hello baseline") if hello["baseline"] else None)

    def value(self, section: str, key: str, default: Any) -> Any:
        """``settings.<key>`` or ``environment.<key>``; ``default`` when the worker did not say."""
        found = getattr(getattr(self, section), key)
        return default if found is None else found


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
    hello: Hello = field(default_factory=Hello)
    records: list[str] = field(default_factory=list)  # the JSON text of each record the worker sent
    finished: list[str] = field(default_factory=list)
    failure: str | None = None

    @property
    def label(self) -> str:
        return self.name.upper()

    def start(self, common: list[str], cwd: Path) -> None:
        req_r, req_w = os.pipe()
        ans_r, ans_w = os.pipe()
        cmd = [sys.executable, "-m", "pytest", "--pyargs", "kvcache.benchmarks", "-p", "no:cacheprovider", "-q",
               "-p", "kvcache.ab.worker", "--kv-ab-control", f"{req_r},{ans_w}", *common, *self.args]
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
        # argparse's "PROG: error: unrecognized arguments: --kv-bogus" names the bad value; pytest's "ERROR: usage:
        # ..." line before it does not
        errors = [line for line in lines if ": error: " in line] or [
            line for line in lines if line.lstrip().startswith(("ERROR", "E ", "ModuleNotFoundError", "ImportError"))
            and not line.lstrip().startswith("ERROR: usage:")]
        return last_line("\n".join(errors[-1:] or lines[-1:]) or "(empty log)")

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


# --- the sides from the command's options ------------------------------------------------------------------------


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


def build_sides(args: argparse.Namespace, out_dir: Path, say: Callable[[str], None]) -> list[Side]:
    """Sides A and B from the command's options: environment, pytest arguments, and a ``--x-release`` installed
    into ``--versions-dir`` (unless it is this environment's own) and put first on ``PYTHONPATH``."""
    from kvcache.analysing import releases as installer

    own = _own_transformers()
    sides = []
    for name in ("a", "b"):
        env = {**os.environ, **parse_env(getattr(args, f"{name}_env"), f"--{name}-env")}
        side_args = split_args(getattr(args, f"{name}_args"), f"--{name}-args")
        refused(side_args, f"--{name}-args")
        release = getattr(args, f"{name}_release")
        if release:
            try:
                release = installer.normalised(release, f"--{name}-release", say)
            except installer.ReleaseError as exc:
                raise ABError(f"--{name}-release: {exc}") from None
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
