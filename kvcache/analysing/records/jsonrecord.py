"""The record machinery: one JSON object as a dataclass, read by :meth:`Record.from_json` and written back by
:meth:`Record.to_json` losing nothing (keys it does not know are kept). Stdlib only."""

from __future__ import annotations

import math
from dataclasses import MISSING, field, fields
from typing import Any, Callable, TypeVar

R = TypeVar("R", bound="Record")
#: How a field's JSON value becomes what the field holds: ``read(value, where)`` (``where`` names it in errors).
Reader = Callable[[Any, str], Any]
# Fields every record has besides its JSON keys.
BOOKKEEPING = ("extra", "absent")


class RecordError(ValueError):
    """A run file that cannot be read as a kvcache-passes run; the message is one line naming the file."""


class Record:
    """One JSON object of the ``kv`` section as a dataclass: its known keys are fields, read by :meth:`from_json`
    and written by :meth:`to_json`. Keys it does not know stay in ``extra``; a known key the object lacked is
    named in ``absent`` and left out when written back (unless set since), so a round trip loses nothing.
    Values are kept as JSON has them (lists, not tuples); checking their types is the JSON Schema's job."""

    extra: dict[str, Any]
    absent: frozenset[str]

    @classmethod
    def from_json(cls: type[R], data: Any, where: str = "") -> R:
        """The record of one JSON object; RecordError (one line, naming ``where``) when it is not an object or
        lacks a key the record cannot do without."""
        where = where or cls.__name__
        data = as_object(data, where)
        known = {f.name: f for f in fields(cls) if f.name not in BOOKKEEPING}
        values: dict[str, Any] = {}
        absent = set()
        for name, spec in known.items():
            if name in data and data[name] is None and spec.default_factory is not MISSING:
                absent.add(name)  # null where an object or a list belongs: read as empty (as an absent key)
            elif name in data:
                if spec.default_factory is not MISSING:
                    kind = type(spec.default_factory())
                    kind = dict if issubclass(kind, Record) else kind  # a record is read from an object
                    if not isinstance(data[name], kind):
                        expected = "an object" if kind is dict else "a list"
                        raise RecordError(f"{where}.{name}: expected {expected}, got {type(data[name]).__name__}")
                values[name] = data[name]
            elif spec.default is MISSING and spec.default_factory is MISSING:
                raise RecordError(f"{where}: no {name!r}")
            else:
                absent.add(name)
        for name, read in cls._readers().items():
            if values.get(name) is not None:
                values[name] = read(values[name], f"{where}.{name}")
        return cls(**values, extra={k: v for k, v in data.items() if k not in known}, absent=frozenset(absent))

    @classmethod
    def of(cls: type[R], **values: Any) -> R:
        """The record of ``values``, made where it is measured (no JSON in between): the known keys not given are
        left out when written, as an absent key would be (unless set since)."""
        given = {f.name for f in fields(cls) if f.name in values}
        return cls(**values, absent=frozenset(f.name for f in fields(cls) if f.name not in (*given, *BOOKKEEPING)))

    def update(self, **values: Any) -> None:
        """Set fields of a record made in code; each is written with it, None included."""
        for name, value in values.items():
            setattr(self, name, value)
        self.absent = self.absent - values.keys()

    @classmethod
    def _readers(cls) -> dict[str, Reader]:
        """The reader of each field that holds records (see :func:`object_of`, :func:`list_of`); none by default:
        values stay as JSON has them."""
        return {}

    def to_json(self) -> dict[str, Any]:
        """The JSON object: known keys in field order (absent ones left out), then ``extra``."""
        out = {}
        for spec in fields(self):
            if spec.name in BOOKKEEPING:
                continue
            value = getattr(self, spec.name)
            default = spec.default if spec.default_factory is MISSING else spec.default_factory()
            if spec.name in self.absent and value == default:
                continue
            out[spec.name] = json_of(value)
        return {**out, **json_of(self.extra)}

    def unknown_keys(self, where: str = "") -> list[str]:
        """Paths (``kv.fit.dynamic.new_figure``) of the keys this record and the records in it do not know."""
        where = where or type(self).__name__.lower()
        out = [f"{where}.{key}" for key in self.extra]
        for spec in fields(self):
            if spec.name not in BOOKKEEPING:
                out += _unknown_keys(getattr(self, spec.name), f"{where}.{spec.name}")
        return out


def _unknown_keys(value: Any, where: str) -> list[str]:
    if isinstance(value, Record):
        return value.unknown_keys(where)
    if isinstance(value, dict):
        return [path for key, item in value.items() for path in _unknown_keys(item, f"{where}.{key}")]
    if isinstance(value, list):
        return [path for i, item in enumerate(value) for path in _unknown_keys(item, f"{where}[{i}]")]
    return []


def json_of(value: Any) -> Any:
    """``value`` with every record in it written as its JSON object."""
    if isinstance(value, Record):
        return value.to_json()
    if isinstance(value, dict):
        return {k: json_of(v) for k, v in value.items()}
    if isinstance(value, list):
        return [json_of(v) for v in value]
    return value


def extra_field() -> Any:
    """The ``extra`` field of a record: keys it does not know."""
    return field(default_factory=dict)


def absent_field() -> Any:
    """The ``absent`` field of a record: known keys its JSON object lacked."""
    return field(default=frozenset(), repr=False, compare=False)


def as_object(value: Any, where: str) -> dict[str, Any]:
    """``value`` when it is a JSON object; RecordError naming ``where`` otherwise."""
    if not isinstance(value, dict):
        raise RecordError(f"{where}: expected an object, got {type(value).__name__}")
    return value


def as_list(value: Any, where: str) -> list[Any]:
    """``value`` when it is a JSON list; RecordError naming ``where`` otherwise."""
    if not isinstance(value, list):
        raise RecordError(f"{where}: expected a list, got {type(value).__name__}")
    return value


def object_of(read: Reader) -> Reader:
    """The reader of a JSON object whose every value ``read`` reads: ``{key: read(item, where.key)}``."""
    return lambda value, where: {k: read(v, f"{where}.{k}") for k, v in as_object(value, where).items()}


def list_of(read: Reader) -> Reader:
    """The reader of a JSON list whose every item ``read`` reads: ``[read(item, where[i])]``."""
    return lambda value, where: [read(v, f"{where}[{i}]") for i, v in enumerate(as_list(value, where))]


def too_large_number(value: Any, where: str = "") -> str | None:
    """Where ``value`` (parsed JSON) holds an integer too large for a float (``10**400``: JSON allows it, every
    figure's arithmetic raised OverflowError), as one line naming the key; None when it holds none."""
    if isinstance(value, int) and not isinstance(value, bool):
        try:
            float(value)
        except OverflowError:
            digits = int(value.bit_length() * 0.30103) + 1
            return (f"{where or 'the document'} is an integer of about {digits} digits, too large for a number "
                    "(the largest is about 1.8e308)")
        return None
    if isinstance(value, dict):
        items = ((f"{where}.{k}" if where else str(k), v) for k, v in value.items())
    elif isinstance(value, list):
        items = ((f"{where}[{i}]", v) for i, v in enumerate(value))
    else:
        return None
    return next((problem for at, item in items for problem in [too_large_number(item, at)] if problem), None)


def jsonable(value: Any) -> Any:
    """Replace non-finite floats by None (JSON has no NaN/inf) recursively."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    return value
