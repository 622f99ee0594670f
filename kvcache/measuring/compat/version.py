"""The installed Transformers release: its version (:data:`VERSION`, comparable with release numbers), the version
gates a development version cannot answer (:func:`ambiguous_gates`), and the one-line reasons of
:class:`Unsupported` that name the release."""

from __future__ import annotations

import re
import sys

import transformers

from kvcache.measuring.cachespec import Unsupported


def parse_version(text: str) -> tuple[int, ...]:
    """``"4.57.1"`` -> ``(4, 57, 1)``; pre-release suffixes are dropped."""
    return tuple(int(x) for x in re.findall(r"\d+", text.split("+")[0])[:3])


class InstalledVersion(tuple):
    """The installed release as a tuple (``(5, 24, 0)``), comparable with ``(5, 23)`` and the like, that notes each
    comparison it cannot answer for the code it runs on.

    A commit between two releases reports the next release as a development version (``5.24.0.dev0``): its code has
    whatever that release's cycle merged so far, so a gate ``VERSION >= (5, 24)`` (a feature 5.24 brought) may be
    true or false there. Every comparison of a development version with a number of its own release (the first
    three parts equal, zeros added) is noted in :data:`AMBIGUOUS` with the caller's place; a probe of ``kvcache
    bisect`` reports such probes as not to be trusted. Released versions, and comparisons with other releases'
    numbers, are exact and note nothing. Every form of a comparison notes: ``<``, ``<=``, ``>``, ``>=``, ``==``,
    ``!=``, with the version on either side (``(5, 24) <= VERSION`` is Python's ``VERSION >= (5, 24)``), of a slice
    (``VERSION[:2]`` is an InstalledVersion too) or of one part (``VERSION[1] >= 24``: a part compared with its own
    value where every later part is 0). Gates that can be asked of the code itself (a class, a keyword) are, in the
    compat package; these are the ones left."""

    text: str
    development: bool
    full: tuple[int, ...]

    def __new__(cls, text: str) -> InstalledVersion:
        self = super().__new__(cls, parse_version(text))
        self.text = text
        self.development = not re.fullmatch(r"\d+(\.\d+)*", text.split("+")[0])
        self.full = tuple(self)  # the whole version, also in a slice of it
        return self

    def _note(self, other: object, op: str) -> None:
        if not self.development or not isinstance(other, tuple):
            return
        pad = lambda t: (tuple(t) + (0, 0, 0))[:3]  # noqa: E731
        if pad(other) != pad(self.full):
            return
        _note_gate(self.text, op, ".".join(map(str, other)))

    def __getitem__(self, key):
        """A slice is an InstalledVersion of the same text (its comparisons note too); a part is a
        :class:`VersionPart`."""
        got = tuple.__getitem__(self, key)
        if isinstance(key, slice):
            part = tuple.__new__(InstalledVersion, got)
            part.text, part.development, part.full = self.text, self.development, self.full
            return part
        index = key + len(self) if key < 0 else key
        return VersionPart(got, self, index)

    def __eq__(self, other):
        self._note(other, "==")
        return tuple.__eq__(self, other)

    def __ne__(self, other):
        self._note(other, "!=")
        return tuple.__ne__(self, other)

    __hash__ = tuple.__hash__

    def __lt__(self, other):
        self._note(other, "<")
        return tuple.__lt__(self, other)

    def __le__(self, other):
        self._note(other, "<=")
        return tuple.__le__(self, other)

    def __gt__(self, other):
        self._note(other, ">")
        return tuple.__gt__(self, other)

    def __ge__(self, other):
        self._note(other, ">=")
        return tuple.__ge__(self, other)

    def __reduce__(self):
        return (InstalledVersion, (self.text,))


def _note_gate(text: str, op: str, wanted: str) -> None:
    """Note, with the place of the comparison's caller, a gate that development version ``text`` cannot answer."""
    frame = sys._getframe(3)  # _note_gate <- _note <- the comparison <- its caller
    where = f"{frame.f_globals.get('__name__', '?')}.{frame.f_code.co_name}:{frame.f_lineno}"
    AMBIGUOUS.setdefault(where, f"{where} gates on transformers {op} {wanted}, which {text} (a commit "
                                f"between releases) cannot answer")


class VersionPart(int):
    """One part of an :class:`InstalledVersion` (``VERSION[1]``): an int whose comparisons with its own value note,
    where every later part is 0 (``VERSION[1] >= 24`` of 5.24.0.dev0: as unanswerable as ``VERSION >= (5, 24)``)."""

    def __new__(cls, value: int, version: InstalledVersion, index: int) -> VersionPart:
        self = super().__new__(cls, value)
        self.version, self.index = version, index
        return self

    def _note(self, other: object, op: str) -> None:
        version = self.version
        if (version.development and isinstance(other, int) and other == int(self)
                and not any(version.full[self.index + 1:])):
            _note_gate(version.text, op, f"{other} (part {self.index} of the version)")

    def __lt__(self, other):
        self._note(other, "<")
        return int.__lt__(self, other)

    def __le__(self, other):
        self._note(other, "<=")
        return int.__le__(self, other)

    def __gt__(self, other):
        self._note(other, ">")
        return int.__gt__(self, other)

    def __ge__(self, other):
        self._note(other, ">=")
        return int.__ge__(self, other)

    def __eq__(self, other):
        self._note(other, "==")
        return int.__eq__(self, other)

    def __ne__(self, other):
        self._note(other, "!=")
        return int.__ne__(self, other)

    __hash__ = int.__hash__


#: ``{caller: reason}`` of every version gate :class:`InstalledVersion` could not answer in this process.
AMBIGUOUS: dict[str, str] = {}


def ambiguous_gates() -> list[str]:
    """The version gates this process took that the installed (development) version cannot answer, one line each."""
    return list(AMBIGUOUS.values())


TRANSFORMERS = transformers.__version__
VERSION = InstalledVersion(TRANSFORMERS)


def release_lacks(what: str) -> Unsupported:
    """:class:`Unsupported` saying that ``what`` is not available in the installed release."""
    return Unsupported(f"{what} is not available in transformers {TRANSFORMERS}")


def exception_line(exc: BaseException) -> str:
    """``"RuntimeError: first line of its message"``: an exception as one line of a skip reason."""
    return f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0]}"
