"""A fork server for the probes of ``kvcache bisect`` (POSIX): ``python -m kvcache.bisect.server MODULES-JSON``, and
its client, :class:`ForkServer`. It imports torch, pytest and their dependencies once (never transformers) and forks
a child per probe, in a process group of its own, that runs ``pytest.main``; used only when forking is safe (one
thread, no CUDA). The protocol and when it kills a child: docs/bisect.md ("How it probes"). Standard library only.
"""

from __future__ import annotations

import importlib
import json
import os
import select
import signal
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any


def child(request: dict) -> None:
    """In the forked child: become the probe's ``python -m pytest``, then exit with its status (never returns)."""
    status = 3
    try:
        _die_with_parent()
        signal.signal(signal.SIGINT, signal.default_int_handler)
        fd = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        sys.path[:0] = [*request["path"], request["cwd"]]  # PYTHONPATH first, the current folder as -m puts it
        importlib.invalidate_caches()
        sys.argv = ["pytest", *request["args"]]
        import pytest

        status = int(pytest.main(list(request["args"])))
    except SystemExit as exc:
        status = exc.code if isinstance(exc.code, int) else 1
    except BaseException:  # noqa: BLE001 - whatever happens, the probe's log says it and the status is not 0
        traceback.print_exc()
        status = 3
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(status)


def _die_with_parent() -> None:
    """Linux: the child is killed when the server dies (even by SIGKILL); elsewhere nothing."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def threads_alive() -> int:
    """Threads of this process: the kernel's count where it has one (native threads too), else Python's."""
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        import threading

        return threading.active_count()


def cuda_initialised() -> bool:
    torch = sys.modules.get("torch")
    try:
        return bool(torch is not None and torch.cuda.is_initialized())
    except Exception:  # noqa: BLE001 - a torch without CUDA support
        return False


class Lines:
    """JSON lines from a file descriptor, read without blocking past ``timeout``."""

    def __init__(self, fd: int):
        self.fd, self.buffer, self.closed = fd, b"", False

    def read(self, timeout: float) -> dict[str, Any] | None:
        """The next line's object, or None on timeout or end of input (then ``closed``)."""
        deadline = time.monotonic() + timeout
        while b"\n" not in self.buffer:
            left = deadline - time.monotonic()
            if self.closed or left <= 0 or not select.select([self.fd], [], [], left)[0]:
                return None
            chunk = os.read(self.fd, 65536)
            if not chunk:
                self.closed = True
                return None
            self.buffer += chunk
        line, self.buffer = self.buffer.split(b"\n", 1)
        return json.loads(line) if line.strip() else self.read(max(0.0, deadline - time.monotonic()))


def serve(preload: list[str]) -> None:
    parent = os.getppid()
    answers = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # anything a preloaded module prints goes to stderr, never into the answers
    for name in preload:
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 - the child imports it again and reports what fails
            pass
    answers.write(json.dumps({"ready": True, "threads": threads_alive(), "cuda": cuda_initialised(),
                              "transformers": "transformers" in sys.modules}) + "\n")
    requests = Lines(0)
    pid = None
    try:
        while not requests.closed and os.getppid() == parent:
            request = requests.read(1.0)
            if not request or "args" not in request:
                continue
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:
                os.setpgid(0, 0)
                answers.close()
                child(request)
            try:
                os.setpgid(pid, pid)  # both sides set it: no window where a kill misses the group
            except OSError:
                pass
            answers.write(json.dumps({"pid": pid}) + "\n")
            deadline = time.monotonic() + float(request.get("timeout") or 1e9)
            while True:
                done, status = os.waitpid(pid, os.WNOHANG)
                if done:
                    pid = None
                    answers.write(json.dumps({"rc": os.waitstatus_to_exitcode(status), "timed_out": False}) + "\n")
                    break
                order = requests.read(0.2)
                gone = requests.closed or os.getppid() != parent
                killed = order is not None and bool(order.get("kill"))
                if gone or killed or time.monotonic() > deadline:
                    kill_group(pid)
                    os.waitpid(pid, 0)
                    pid = None
                    if gone:
                        return
                    answers.write(json.dumps({"rc": -signal.SIGKILL, "timed_out": not killed}) + "\n")
                    break
    finally:
        if pid:
            kill_group(pid)


def kill_group(pid: int) -> None:
    """SIGKILL the process group of the server's own child ``pid`` (not reaped yet, so the group is still its own)."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except OSError:
        pass


class ServerRefused(OSError):
    """The server started, but forking from it would not be safe; the message says why."""


class ForkServer:
    """The client: a :mod:`kvcache.bisect.server` process and its answers (JSON lines on its stdout)."""

    def __init__(self, preload: list[str], cwd: Path, env: dict[str, str], start_timeout: float = 300):
        if not hasattr(os, "fork"):
            raise OSError("no fork on this platform")
        env = dict(env)
        env["PYTHONPATH"] = env["PYTHONPATH"].split(os.pathsep, 1)[1] if os.pathsep in env["PYTHONPATH"] else ""
        env["OPENBLAS_NUM_THREADS"] = "1"  # no BLAS thread alive across a fork (counted figures need none)
        self.proc = subprocess.Popen([sys.executable, "-m", "kvcache.bisect.server", json.dumps(preload)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                     cwd=cwd, env=env)
        self.answers = Lines(self.proc.stdout.fileno())
        self.running = False  # a probe is running now
        ready = self.answers.read(start_timeout)
        if not ready or not ready.get("ready") or ready.get("transformers"):
            self.close()
            raise OSError("the fork server did not start")
        why = refusal(ready)
        if why:
            self.close()
            raise ServerRefused(why)

    def run(self, args: list[str], cwd: Path, env: dict[str, str], path: list[str], log: Path,
            timeout: float) -> int | None:
        """pytest's exit status, or None when the server killed it after ``timeout`` seconds."""
        request = {"args": args, "cwd": str(cwd), "env": env, "path": path, "log": str(log), "timeout": timeout}
        self.send(request)
        started = self.answers.read(60)
        if not started or "pid" not in started:
            raise OSError("the fork server stopped answering")
        self.running = True
        done = self.answers.read(timeout + 60)  # the server kills the probe at ``timeout``
        if done is None:
            raise OSError("the fork server stopped answering")
        self.running = False
        return None if done.get("timed_out") else int(done["rc"])

    def send(self, request: dict[str, Any]) -> None:
        self.proc.stdin.write((json.dumps(request) + "\n").encode())
        self.proc.stdin.flush()

    def close(self) -> None:
        """Stop the server; it kills the probe it runs, if one is running (interrupted: nothing is left behind)."""
        try:
            if self.running:
                self.send({"kill": True})
            self.proc.stdin.close()
            self.proc.wait(timeout=10)
        except (OSError, ValueError, subprocess.TimeoutExpired):
            self.proc.kill()  # its child dies with it (Linux), or on its own
            self.proc.wait()
        self.running = False


def refusal(ready: dict[str, Any]) -> str | None:
    """Why probes must not be forked from a server that answered ``ready``, or None."""
    if ready.get("cuda"):
        return "CUDA was initialised by a preloaded module (a forked child could not use it)"
    if int(ready.get("threads") or 1) > 1:
        return f"{ready['threads']} threads alive after its imports (a fork copies only one)"
    return None


if __name__ == "__main__":
    serve(json.loads(sys.argv[1]) if len(sys.argv) > 1 else [])
