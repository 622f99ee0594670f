"""Files a run or a command writes: written atomically through symlinks (an output folder through a temp folder
beside it), probed before anything runs, never two outputs (or an output and a file read) on one file, a failed
write one line (:class:`OutputError`); and the signals once a command or the suite is stopping. The one home of
these rules for the suite and every command (docs/running.md, "Checks before a run"). Analysing wing: stdlib only.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import signal
import stat
import tempfile
import threading
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path


def target(path: str | Path) -> Path:
    """The file a write to ``path`` lands in: symlinks followed (a dangling link's target included), absolute."""
    return Path(os.path.realpath(path))


def path_shown(path: str | Path) -> str:
    """``path`` as given, with its target when it is a symlink (``link -> target``), for messages."""
    real = target(path)
    return str(path) if real == Path(os.path.abspath(path)) else f"{path} (-> {real})"


def same_file(a: str | Path, b: str | Path) -> bool:
    """Whether ``a`` and ``b`` are one file: the same target after symlinks, or (both existing) the same inode, as
    hard links or paths through a bind mount are."""
    if target(a) == target(b):
        return True
    try:
        sa, sb = os.stat(a), os.stat(b)
    except OSError:
        return False
    return (sa.st_dev, sa.st_ino) == (sb.st_dev, sb.st_ino)


def outputs_problem(found: list[tuple[str, str | Path, bool]]) -> str | None:
    """Before anything runs: ``found`` is ``[(option, path, written)]``, the files a command reads and writes. No
    written file may be another one of them (compared by :func:`same_file`), and every written one must pass
    :func:`write_problem`. The problem is one line naming the options and files; None when there is none."""
    for i, (option_a, a, written_a) in enumerate(found):
        for option_b, b, written_b in found[i + 1:]:
            if not (written_a or written_b) or not same_file(a, b):
                continue
            if written_a and written_b:
                what = "one would be written over the other"
            else:
                what = f"{option_b if written_b else option_a} would replace it"
            return f"{option_a} {a} and {option_b} {b} are one file ({target(a)}): {what}; give each its own path"
    for option, path, written in found:
        problem = write_problem(path) if written else None
        if problem:
            return f"{option} {problem}"
    return None


def paths_problem(reads: Iterable[tuple[str, str | Path | None]] = (),
                  writes: Iterable[tuple[str, str | Path | None]] = (),
                  folders: Iterable[tuple[str, str | Path | None, Iterable[str]]] = ()) -> str | None:
    """The rule every command applies before any work: ``reads`` and ``writes`` are ``[(option, path)]`` (a None
    path, an option not given, is left out), ``folders`` ``[(option, folder, names)]``: an output folder and the
    names of the files written into it. No output lands on an input or on another output (same file, a symlink or
    a hard link to it, a file written inside an output folder included: :func:`outputs_problem`), every output
    file passes :func:`write_problem` and every output folder :func:`folder_problem`. The problem is one line
    naming the option and the path; None when there is none."""
    found: list[tuple[str, str | Path, bool]] = [(o, p, False) for o, p in reads if p is not None]
    found += [(o, p, True) for o, p in writes if p is not None]
    given = [(o, p, tuple(names)) for o, p, names in folders if p is not None]
    for option, folder, names in given:
        problem = folder_problem(folder)
        if problem:
            return f"{option} {problem}"
        found += [(f"{option}'s {name}", Path(folder, name), True) for name in names]
    return outputs_problem(found)


def folder_problem(path: str | Path) -> str | None:
    """Why files could not be written into the folder ``path``, found by trying without changing anything: a
    folder that exists gets a temp file created and removed in it (an immutable, ``chattr +i``, or append-only,
    ``chattr +a``, folder refuses that, root or not; one without write permission refuses anyone but root); one
    that does not exist yet is probed at its nearest existing ancestor, where it will be created (a temp folder made
    and removed). None when this works; the problem names ``path`` (and its target if it is a symlink)."""
    real = target(path)
    if real.exists() and not real.is_dir():
        return f"{path_shown(path)}: is not a folder"
    folder = real
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    if not folder.is_dir():
        return f"{path_shown(path)}: {folder} is not a folder"
    try:
        if folder == real:
            fd, probe = tempfile.mkstemp(dir=folder, prefix=".kvcache-", suffix=".probe")
            os.close(fd)
            os.unlink(probe)
        else:
            os.rmdir(tempfile.mkdtemp(dir=folder, prefix=".kvcache-", suffix=".probe"))
    except OSError as exc:
        what = "create a file in it" if folder == real else f"create a folder in {folder}"
        return f"{path_shown(path)}: cannot {what} ({_reason(exc)}; immutable, append-only or no permission?)"
    return None


def quiet_signals(prog: str) -> None:
    """From now until the process exits, SIGINT and SIGTERM only print a line (``PROG: SIGTERM again: already
    stopping``): what a command or the suite installs once its first signal has been taken, so that a second
    one, whenever it comes (the results being written, pytest's teardown, the interpreter's exit: there both are
    ignored, :func:`ignore_signals`), neither changes the exit status nor prints a traceback. A signal someone else
    ignores stays ignored; only from the main thread (where handlers can be set). A later session in the same
    process (``pytest.main`` called again) may replace these handlers with its own (:func:`is_quiet`)."""
    if threading.current_thread() is not threading.main_thread():
        return

    def say(signum: int, frame: object) -> None:
        # os.write, not sys.stderr: the signal may land inside a write to sys.stderr (a reentrant call raises)
        os.write(2, f"\n{prog}: {signal.Signals(signum).name} again: already stopping\n".encode())

    say.kvcache_quiet = True  # type: ignore[attr-defined]

    for signum in (signal.SIGINT, signal.SIGTERM):
        if signal.getsignal(signum) is not signal.SIG_IGN:
            signal.signal(signum, say)
    if not _IGNORED_AT_EXIT:
        _IGNORED_AT_EXIT.append(True)
        atexit.register(ignore_signals)


#: Whether :func:`ignore_signals` is registered to run at exit (once per process).
_IGNORED_AT_EXIT: list[bool] = []


def ignore_signals() -> None:
    """SIGINT and SIGTERM ignored from now on (``SIG_IGN``): what a stopping process does as it exits (registered
    with :mod:`atexit` by :func:`quiet_signals`). The interpreter's shutdown puts a Python handler back to the
    default, which a signal then dies of (130, 143); an ignored signal stays ignored, so the exit status stays the
    one the command or the suite chose. Only from the main thread."""
    if threading.current_thread() is threading.main_thread():
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, signal.SIG_IGN)


@contextlib.contextmanager
def signals_stop(prog: str, stop: Callable[[str], BaseException]) -> Iterator[None]:
    """Within the block, the first SIGINT or SIGTERM raises ``stop(signal name)`` (what stops a command: Ctrl-C and
    SIGTERM alike) and from then on, until the process exits, every later one only prints (:func:`quiet_signals`):
    the command's clean-up and exit status stay its own. At the end of the block the previous handlers come back
    when no signal came; a signal ignored before (``nohup``) stays ignored. Only from the main thread."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    came: list[int] = []

    def handle(signum: int, frame: object) -> None:
        came.append(signum)
        quiet_signals(prog)
        raise stop(signal.Signals(signum).name)

    previous = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM) if signal.getsignal(s) is not
                signal.SIG_IGN}
    for signum in previous:
        signal.signal(signum, handle)
    try:
        yield
    finally:
        for signum, handler in previous.items():
            if not came:  # no signal came: the handlers from before (after one, every later one only prints)
                signal.signal(signum, handler)


def is_quiet(handler: object) -> bool:
    """Whether ``handler`` is one :func:`quiet_signals` installed (a finished session's, free to replace)."""
    return bool(getattr(handler, "kvcache_quiet", False))


def write_problem(path: str | Path) -> str | None:
    """Why :func:`write_text_atomically` could not write ``path``, found by trying without changing anything:
    a temp file is created and removed in the target's folder (what the atomic replace needs), and an existing
    target is opened for writing without truncating (no ``O_TRUNC``, no ``O_APPEND``: an immutable file, ``chattr
    +i``, and an append-only one, ``chattr +a``, refuse that, root or not, as they refuse being replaced; a
    read-only one refuses it to anyone but root). A folder that does not exist yet is probed at its nearest
    existing ancestor, where :func:`write_text_atomically` will create it. None when all of this works. The problem
    names ``path`` (and its target if it is a symlink)."""
    real = target(path)
    if real.is_dir():
        return f"{path_shown(path)}: is a directory, expected a file"
    if _special(real):
        return None  # written in place (a terminal, a pipe): opening a pipe to probe it could block
    folder = real.parent
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    if not folder.is_dir():
        return f"{path_shown(path)}: {folder} is not a directory"
    try:
        fd, probe = tempfile.mkstemp(dir=folder, prefix=f".{real.name}.", suffix=".probe")
    except OSError as exc:
        return f"{path_shown(path)}: cannot create a file in {folder} ({_reason(exc)})"
    os.close(fd)
    try:
        os.unlink(probe)
    except OSError as exc:
        return f"{path_shown(path)}: cannot remove a file in {folder} ({_reason(exc)}; the probe {probe} is left there)"
    if real.exists():
        try:
            os.close(os.open(real, os.O_WRONLY))
        except OSError as exc:
            return f"{path_shown(path)}: cannot be written ({_reason(exc)}; immutable, append-only or read-only?)"
    return None


def write_text_atomically(path: str | Path, text: str) -> None:
    """Write ``text`` (UTF-8) to a temp file beside ``path``'s target (symlinks followed; its folder created when
    missing), flush it to disk, then replace the target with it. The target keeps its mode (a new file gets the
    umask's); a symlink stays a link. On any error or signal the temp file is removed and the old file is left as
    it was."""
    real = target(path)
    if _special(real):
        with open(real, "w", encoding="utf-8") as handle:
            handle.write(text)
        return
    try:
        mode = real.stat().st_mode & 0o7777
    except FileNotFoundError:
        umask = os.umask(0)
        os.umask(umask)
        mode = 0o666 & ~umask
    data = text.encode("utf-8")  # before the temp file exists: nothing to clean up if this fails
    real.parent.mkdir(parents=True, exist_ok=True)  # a folder that does not exist yet (probed at its ancestor)
    fd, tmp = tempfile.mkstemp(dir=real.parent, prefix=f".{real.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, real)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


class OutputError(Exception):
    """An output that could not be written (a full disk, ``/dev/full``): one line naming the option and the file.
    A command's runner (:func:`kvcache.cli.run`) prints it and exits 2."""


def write_output(option: str, path: str | Path, text: str) -> None:
    """:func:`write_text_atomically`, with a failure turned into :class:`OutputError` (``--json out.json: cannot
    write (No space left on device)``): the old file, if any, is left as it was."""
    try:
        write_text_atomically(path, text)
    except OSError as exc:
        raise OutputError(f"{option} {path}: cannot write ({_reason(exc)})") from None


@contextlib.contextmanager
def staged_folder(option: str, folder: str | Path, names: Iterable[str],
                  keep: tuple[type[BaseException], ...] = ()) -> Iterator[Path]:
    """An output folder written whole or not at all: the block writes into a temp folder made beside ``folder``'s
    target (symlinks followed; one filesystem, so a rename never copies); when it ends, each file written is renamed
    into ``folder`` (created when missing) and every other file of ``names`` (the command's own outputs: an older
    run's) is removed from it. A write that fails (OSError) leaves ``folder`` as it was and is :class:`OutputError`
    (``--out report: cannot write report.html (No space left on device)``), as any other error or a signal leaves
    it, except an exception of ``keep``: the work's own error after whole files (no matplotlib: the tables are
    written all the same), whose files are moved in before it goes on. Never a 0-byte report.html, a truncated PNG
    or a folder mixing two runs."""
    real = target(folder)
    try:
        real.parent.mkdir(parents=True, exist_ok=True)
        stage = Path(tempfile.mkdtemp(dir=real.parent, prefix=f".{real.name}.", suffix=".tmp"))
    except OSError as exc:
        raise OutputError(f"{option} {folder}: cannot write ({_reason(exc)})") from None

    def move_in() -> None:
        try:
            real.mkdir(exist_ok=True)
            made = sorted(p.name for p in stage.iterdir())
            for name in made:
                os.replace(stage / name, real / name)
            for name in set(names) - set(made):
                (real / name).unlink(missing_ok=True)
        except OSError as exc:
            raise OutputError(f"{option} {folder}: cannot write ({_reason(exc)})") from None

    try:
        try:
            yield stage
        except OSError as exc:
            name = f" {Path(exc.filename).name}" if isinstance(exc.filename, (str, Path)) else ""
            raise OutputError(f"{option} {folder}: cannot write{name} ({_reason(exc)})") from None
        except keep:
            move_in()
            raise
        move_in()
    finally:
        shutil.rmtree(stage, ignore_errors=True)


def _special(real: Path) -> bool:
    """Whether ``real`` exists and is neither a regular file nor a directory (a device, a pipe, a socket)."""
    try:
        mode = real.stat().st_mode
    except OSError:
        return False
    return not stat.S_ISREG(mode) and not stat.S_ISDIR(mode)


def _reason(exc: OSError) -> str:
    return " ".join(str(exc.strerror or exc).split())
