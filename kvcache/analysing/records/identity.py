"""Run identity: what makes two runs (or a run and a baseline) comparable, the one definition behind the baseline
keys and ``kvcache compare``'s mismatch check; each measure keys on the fields that change it (:class:`Identity`,
:data:`EXTRA_FIELDS`, the allowlisted environment :data:`VARIABLES`). docs/gate.md ("Run identity"). Stdlib only.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from kvcache.analysing.judge.measure_table import GROUPS
from kvcache.analysing.presets import ARCH_PREFIX, FAMILY_PRESETS, LAYERS_SUFFIX, PRESETS
from kvcache.analysing.records.context import Environment, RunSettings, Section, unset_field
from kvcache.analysing.records.jsonrecord import BOOKKEEPING, extra_field
from kvcache.analysing.settings import Settings

#: Every field of a run's identity, in display order.
FIELDS = ("device_name", "device_type", "model", "dtype", "threads", "torch")


@dataclass
class Identity(Section):
    """``kv.identity``: what makes runs comparable. The fields after ``torch`` were added after schema 1; each
    defaults to the value a run that predates it had, and is written only when set away from it (:func:`of`)."""

    device_name: str | None = None
    device_type: str | None = None
    model: str | None = None
    dtype: str | None = None
    threads: int | None = None
    torch: str | None = None
    compile: str = "off"  # --kv-compile: a compiled run never meets an eager baseline
    driver: str = "loop"  # --kv-driver: generate() adds its own per-step work
    batch: int = 1  # --kv-batch
    ragged: bool = False  # --kv-ragged
    fill: str = "synthetic"  # --kv-fill: a prefilled cache holds what a real forward wrote (a press's compression)
    env: str = ""  # allowlisted environment variables set away from their default (VARIABLES), "NAME=value,..."
    extra: dict[str, Any] = extra_field()
    absent: frozenset[str] = unset_field()


#: Fields added to the identity after schema 1, with the value a run that predates them had.
EXTRA_FIELDS: dict[str, Any] = {f.name: f.default for f in fields(Identity) if f.name not in (*FIELDS, *BOOKKEEPING)}
#: Environment variables that change what a run computes, with the value that changes nothing (what unset means).
VARIABLES: dict[str, str] = {
    # "1": Transformers' SDPA integration passes enable_gqa=True whatever the mask (transformers 5.23 and later): a
    # compiled StaticCache step then reads K/V once instead of expanding them to every query head (7 passes -> 1).
    "TRANSFORMERS_SDPA_FORCE_GQA": "0",
}
#: How a field is spelled in a key, when not by its bare value.
KEY_FORMS = {"torch": "torch {}"}


#: Fields of a config.json that name where and with which release it was saved, not the model: left out of its hash.
VOLATILE_CONFIG_FIELDS = ("_name_or_path", "transformers_version")


def recorded_settings(settings: Settings) -> RunSettings:
    """The settings as a run records them (``kv.settings``): ``model`` is the model's identity (:func:`model_key`: a
    local directory as ``name@confighash``), and a directory's path as given is kept beside it as ``model_path``;
    ``gpus`` only when ``--kv-gpus`` was given, ``decoding`` only when not greedy alone (a run without them keeps its
    settings as before)."""
    values = {spec.name: getattr(settings, spec.name) for spec in fields(settings)}
    values = {k: list(v) if isinstance(v, tuple) else dict(v) if isinstance(v, dict) else v for k, v in values.items()}
    if not settings.gpus:
        del values["gpus"]
    if tuple(settings.decoding) == ("greedy",):  # --kv-decoding greedy alone: the settings as before it existed
        del values["decoding"]
    values["model"] = model_key(settings.model)
    if values["model"] != settings.model:
        values["model_path"] = settings.model
    return RunSettings.of(**values)


def model_key(name: str) -> str:
    """What a ``--kv-model`` value is called in a run's identity (``settings.model``, hence its baseline keys): a
    preset, an ``arch:<model_type>`` or a hub id as given; a local directory as its name plus the first 8 hex digits
    of the SHA-256 of its ``config.json`` (``mymodel@3f2a9c1b``), so the same model typed as a relative or an
    absolute path, or a moved checkout, keeps its identity, and a changed config gets a new one. The JSON is hashed
    canonically (keys sorted, no whitespace, without :data:`VOLATILE_CONFIG_FIELDS`); a file that is not a JSON
    object, by its bytes. Nothing is imported or built."""
    match = LAYERS_SUFFIX.match(name)
    base = match["base"] if match else name
    if base in PRESETS or base in FAMILY_PRESETS or base.startswith(ARCH_PREFIX):
        return name  # an arch:<model_type> too: keyed by the architecture (its release is the run's identity)
    path = Path(name).expanduser()
    file = path / "config.json"
    try:
        data = file.read_bytes()
    except OSError:
        return name  # a hub id (or nothing the run can load: refused before it runs)
    try:
        raw = json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError):
        raw = None
    if isinstance(raw, dict):
        raw = {k: v for k, v in raw.items() if k not in VOLATILE_CONFIG_FIELDS}
        data = json.dumps(raw, sort_keys=True, separators=(",", ":")).encode()
    return f"{path.resolve().name or path.resolve()}@{hashlib.sha256(data).hexdigest()[:8]}"


def of_run(kv: Any) -> Identity:
    """The identity of a run from its ``kv`` section, a :class:`~kvcache.analysing.records.KV` (its ``environment``
    and ``settings``)."""
    return of(kv.environment, kv.settings)


def of(env: Environment, settings: RunSettings) -> Identity:
    """The identity of a run from its environment (``kv.environment``) and settings (``kv.settings``); an extra
    field the settings do not record, or record at its default, keeps its default."""
    ident = Identity(device_name=env.device_name, device_type=env.device_type, model=settings.model,
                     dtype=settings.dtype, threads=env.threads, torch=env.torch, absent=frozenset(EXTRA_FIELDS))
    for name, default in EXTRA_FIELDS.items():  # only when not at its default: a default run keeps its identity
        value = getattr(settings, name, None)
        if value is not None and value != default:
            setattr(ident, name, value)
    ident.env = env_field(env.variables)
    return ident


def env_field(variables: Any) -> str:
    """The identity's ``env`` field from ``kv.environment.variables`` ({NAME: value}): the allowlisted variables
    (:data:`VARIABLES`) set away from their default, ``"NAME=value"`` joined by commas in name order; ``""`` for
    none."""
    if not isinstance(variables, dict):
        return ""
    return ",".join(f"{name}={variables[name]}" for name in sorted(variables)
                    if name in VARIABLES and str(variables[name]) != VARIABLES[name])


def variables_of(environ: Any) -> dict[str, str]:
    """The allowlisted variables (:data:`VARIABLES`) set in ``environ`` (e.g. ``os.environ``), as recorded in
    ``kv.environment.variables``: {NAME: value}, only those set."""
    return {name: str(environ[name]) for name in sorted(VARIABLES) if name in environ}


def baseline_key(ident: Identity, measure: str) -> str:
    """The baseline key of ``measure`` for a run of this identity: ``"cpu | tiny | bfloat16"`` (counted),
    ``"cpu: AMD EPYC (2 threads) | tiny | bfloat16"`` (timed), ``"cpu | tiny | bfloat16 | torch 2.13.0+cpu"``
    (overhead). Extra fields appear only when not default."""
    parts = [KEY_FORMS.get(name, "{}").format(getattr(ident, name)) for name in GROUPS[measure]]
    parts += [f"{name}={getattr(ident, name)}" for name, default in EXTRA_FIELDS.items()
              if getattr(ident, name) != default]
    return " | ".join(parts)


def mismatches(idents: list[Identity], measures: list[str] | tuple[str, ...]) -> dict[str, list[Any]]:
    """Fields (of the given measures, extra fields included) on which the runs differ: {field: [value per run]}."""
    names = dict.fromkeys(f for m in measures for f in GROUPS[m])
    names.update(dict.fromkeys(EXTRA_FIELDS))
    if "timed" in measures:
        names["threads"] = None
    out = {}
    for name in names:
        values = [getattr(i, name) for i in idents]
        if len(set(map(str, values))) > 1:
            out[name] = values
    return out


def field_text(name: str, value: Any) -> str:
    """A field's value as a message names it: ``env`` with no allowlisted variable set away from its default is
    ``unset``, not an empty string."""
    return "unset" if name == "env" and value in ("", None) else str(value)


def describe(ident: Identity) -> str:
    """``"tiny, bfloat16 on cpu: AMD EPYC (2 threads)"``: what a column header or a message names."""
    extra = "".join(f", {name} {getattr(ident, name)}" for name, default in EXTRA_FIELDS.items()
                    if getattr(ident, name) != default)
    device = ident.device_name or ident.device_type
    return f"{ident.model}, {ident.dtype}{extra} on {device}"
