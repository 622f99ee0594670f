"""Versioned JSON files, read and written one way (asv's ``load_json``/``write_json``/``update_json`` are the model):
:func:`load_json` reads a document and checks its version key against the versions its reader accepts,
:func:`write_json` writes one atomically (:func:`kvcache.analysing.files.write_text_atomically`), :func:`update_json`
reads, changes and writes one under a lock. Every problem is one line naming the file (and, for a version, the
versions accepted), raised as the caller's own error type. What a document holds is its record's business (a
:class:`~kvcache.analysing.records.jsonrecord.Record` per format, whose ``from_json`` is the only reader of the raw
dict).
Analysing wing: stdlib only."""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable, Collection, Iterator
from pathlib import Path
from typing import Any, TypeVar

from kvcache.analysing import files
from kvcache.analysing.records.jsonrecord import jsonable

D = TypeVar("D")
#: The error a caller raises for its file (BaselineError, BisectError, ...): made from the one-line message.
ErrorType = Callable[[str], Exception]


class JSONFileError(ValueError):
    """A JSON file that cannot be read or written; the message is one line naming the file."""


def error_line(exc: BaseException) -> str:
    """An OS or decoding error as a few words on one line."""
    return " ".join(str(getattr(exc, "strerror", None) or exc).split())


def accepted_text(accepted: Collection[Any]) -> str:
    """``1, 2`` (a version None, a document without the key, is ``none``)."""
    return ", ".join("none" if v is None else str(v) for v in accepted)


def check_version(doc: Any, where: str, *, key: str, accepted: Collection[Any], what: str,
                  error: ErrorType = JSONFileError) -> dict[str, Any]:
    """``doc`` when it is a JSON object whose ``key`` (None when it lacks it) is one of ``accepted``; else ``error``
    with one line: ``WHERE is not a WHAT (KEY 7 is not one of the accepted 1, 2)``."""
    if not isinstance(doc, dict):
        raise error(f"{where} is not a {what} (its top level is a {type(doc).__name__}, expected an object)")
    version = doc.get(key)
    if isinstance(version, bool) or version not in accepted:
        raise error(f"{where} is not a {what} ({key} {version!r} is not one of the accepted "
                    f"{accepted_text(accepted)})")
    return doc


def parse_json(text: str, where: str, *, what: str, error: ErrorType = JSONFileError) -> Any:
    """The JSON value of ``text``; ``error`` (``WHERE: WHAT is not JSON (why at line N)``) when it is not JSON."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise error(f"{where}: {what} is not JSON ({exc.msg} at line {exc.lineno})") from None
    except ValueError:  # an integer beyond Python's limit of digits (4300)
        raise error(f"{where}: not a {what} (an integer of more than 4300 digits)") from None


def read_text(path: str | Path, where: str, *, what: str, error: ErrorType = JSONFileError) -> str | None:
    """The text of ``path`` (UTF-8); None when it does not exist; ``error`` when it cannot be read."""
    try:
        return Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as exc:
        raise error(f"{where}: cannot read {what} ({error_line(exc)})") from None


def load_json(path: str | Path, *, key: str = "schema", accepted: Collection[Any], what: str,
              where: str | None = None, error: ErrorType = JSONFileError,
              missing: Callable[[], dict[str, Any]] | None = None) -> dict[str, Any]:
    """The JSON object in ``path`` whose version ``key`` is one of ``accepted`` (a format without one accepts None).
    ``where`` names the file in messages (default its path); ``what`` names the format (``kvcache baseline``). A
    missing file is ``missing()`` when given, else an error like any other unreadable file."""
    where = str(path) if where is None else where
    text = read_text(path, where, what=what, error=error)
    if text is None:
        if missing is not None:
            return missing()
        raise error(f"{where}: cannot read {what} (no such file)")
    return check_version(parse_json(text, where, what=what, error=error), where, key=key, accepted=accepted, what=what,
                         error=error)


def dumps(doc: Any, *, indent: int | None = 1, sort_keys: bool = False, newline: bool = True) -> str:
    """The text a document is written as: non-finite numbers as null (:func:`jsonable`; JSON has no NaN)."""
    return json.dumps(jsonable(doc), indent=indent, sort_keys=sort_keys) + ("\n" if newline else "")


def write_json(path: str | Path, doc: Any, *, indent: int | None = 1, sort_keys: bool = False, newline: bool = True,
               what: str = "file", where: str | None = None, error: ErrorType | None = JSONFileError) -> None:
    """Write ``doc`` atomically (:func:`kvcache.analysing.files.write_text_atomically`: a temp file replaces the
    target, a symlink stays a link, the mode is kept, a signal mid-write leaves the old file). A file that cannot
    be written is ``error`` (``WHERE: cannot write WHAT (why)``); with ``error=None`` the OSError itself."""
    text = dumps(doc, indent=indent, sort_keys=sort_keys, newline=newline)
    try:
        files.write_text_atomically(path, text)
    except OSError as exc:
        if error is None:
            raise
        raise error(f"{files.path_shown(path) if where is None else where}: cannot write {what} "
                    f"({error_line(exc)})") from None


def update_json(path: str | Path, change: Callable[[D], D], *, load: Callable[[Path], D],
                write: Callable[[Path, D], None],
                lock: Callable[[Path], contextlib.AbstractContextManager[Any]] | None = None) -> D:
    """Read ``path`` (``load``), change it (``change(document)``, the new document) and write it (``write``) under
    ``lock(path)`` (default :func:`folder_lock`), so that concurrent writers lose no update; the new document."""
    p = Path(path)
    with (lock or folder_lock)(p):
        doc = change(load(p))
        write(p, doc)
    return doc


@contextlib.contextmanager
def folder_lock(path: Path, error: ErrorType = JSONFileError) -> Iterator[None]:
    """An exclusive lock on the folder of ``path``'s target (symlinks followed; POSIX ``flock``), held while the
    file is read and rewritten, so that concurrent writers serialise, through links or not; no lock where
    ``fcntl`` is missing."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - Windows
        yield
        return
    folder = files.target(path).parent  # a symlinked file: where its target is written
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError as exc:
        raise error(f"{path}: cannot open its folder to lock it ({error_line(exc)})") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the lock


@contextlib.contextmanager
def sibling_lock(path: Path) -> Iterator[None]:
    """An exclusive lock on ``path``'s sibling ``.lock`` file (``history.jsonl.lock``), where the platform has
    ``fcntl``."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not on POSIX
        yield
        return
    with open(path.with_name(path.name + ".lock"), "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
