"""The records of what a run ran with: its settings (``kv.settings``), its machine and libraries
(``kv.environment``) and its model's geometry (``kv.model``). A run identity (``kv.identity``) is
:class:`kvcache.analysing.records.identity.Identity`. Stdlib only.

Every key of these sections may be missing: a file of an older schema lacks the keys added since, and a section
is written with the keys it was given (a key not set is left out, so a written run keeps its shape). A missing key
reads as None (an empty list or object for a list or an object); whoever reads it says what None means there."""

from __future__ import annotations

from dataclasses import Field, dataclass, field, fields, make_dataclass
from typing import Any

from kvcache.analysing.records.jsonrecord import BOOKKEEPING, Reader, Record, extra_field, object_of
from kvcache.analysing.settings import Settings

#: The ``absent`` of a section made in code: every key not set is left out when written (see :class:`Section`).
UNSET = frozenset({"*"})


def unset_field() -> Any:
    """The ``absent`` field of a :class:`Section`."""
    return field(default=UNSET, repr=False, compare=False)


class Section(Record):
    """A record whose every key is optional: made in code, the keys left at their default are not written (read
    from a file, the keys the file had are written back, as for every record)."""

    def __post_init__(self) -> None:
        if self.absent == UNSET:
            self.absent = frozenset(f.name for f in fields(self) if f.name not in BOOKKEEPING)  # type: ignore[misc]


def _recorded(spec: Field[Any]) -> tuple[str, Any, Any]:
    """A :class:`~kvcache.analysing.settings.Settings` field as ``kv.settings`` records it: a tuple as a list, an
    object as an object (both empty when absent), any other value as itself (None when absent)."""
    kind = str(spec.type)
    if kind.startswith("tuple"):
        return spec.name, "list[Any]", field(default_factory=list)
    if kind.startswith("dict"):
        return spec.name, "dict[str, Any]", field(default_factory=dict)
    return spec.name, f"{kind} | None", None


#: ``kv.settings``: the ``--kv-*`` settings of the run (:class:`kvcache.analysing.settings.Settings`, in the same
#: units: sizes in bytes, times in seconds, tolerances in passes or fractions). Its fields are ``Settings``'s, in
#: its order (each an option of :mod:`kvcache.analysing.options`, or a figure no option sets), made here rather
#: than declared twice, and ``model_path``: ``model`` is the model's identity
#: (:func:`kvcache.analysing.records.identity.model_key`), ``model_path`` the directory as given when it differs;
#: ``gpus`` is recorded only when ``--kv-gpus`` was given.
RunSettings = make_dataclass(
    "RunSettings",
    [*(_recorded(spec) for spec in fields(Settings)), ("model_path", "str | None", None),
     ("extra", "dict[str, Any]", extra_field()), ("absent", "frozenset[str]", unset_field())],
    bases=(Section,), namespace={"__doc__": "``kv.settings``: the ``--kv-*`` settings of the run, the fields of "
                                            ":class:`kvcache.analysing.settings.Settings` and ``model_path``."})
RunSettings.__module__ = __name__


@dataclass
class Environment(Section):
    """``kv.environment``: the device (``device_type``, ``device_name``), the Transformers and torch releases,
    Python, the platform, torch's CPU threads and ``variables``: the environment variables known to change what runs
    (:data:`kvcache.analysing.records.identity.VARIABLES`) that were set, {NAME: value}."""

    device_type: str | None = None
    device_name: str | None = None
    transformers: str | None = None
    torch: str | None = None
    python: str | None = None
    platform: str | None = None
    threads: int | None = None
    variables: dict[str, str] = field(default_factory=dict)
    extra: dict[str, Any] = extra_field()
    absent: frozenset[str] = unset_field()


@dataclass
class LayerKinds(Section):
    """``kv.model.kinds.<kind>``: the layers of one kind (full, sliding, linear), the K/V bytes one token adds to
    them and, for sliding layers, the window in tokens."""

    layers: int | None = None
    bytes_per_token: int | None = None
    window: int | list[int] | None = None
    extra: dict[str, Any] = extra_field()
    absent: frozenset[str] = unset_field()


@dataclass
class ModelGeometry(Section):
    """``kv.model``: the model's geometry; ``bytes_per_token``: K and V bytes one cached token adds (all layers);
    ``weight_bytes``: bytes of all parameters; ``max_position_embeddings``: its trained context in tokens;
    ``kinds``: per kind of layer, where layers differ; ``attention`` and ``changes`` (``arch:`` models): the attention
    implementation the architecture runs by default and what differs from its type's default config."""

    name: str | None = None
    layers: int | None = None
    heads: int | None = None
    kv_heads: int | None = None
    head_dim: int | None = None
    hidden: int | None = None
    vocab: int | None = None
    dtype: str | None = None
    bytes_per_token: int | None = None
    weight_bytes: int | None = None
    parameters: int | None = None
    max_position_embeddings: int | None = None
    kinds: dict[str, LayerKinds] = field(default_factory=dict)
    attention: str | None = None
    changes: list[str] = field(default_factory=list)
    extra: dict[str, Any] = extra_field()
    absent: frozenset[str] = unset_field()

    @classmethod
    def _readers(cls) -> dict[str, Reader]:
        return {"kinds": object_of(LayerKinds.from_json)}
