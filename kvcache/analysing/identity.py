"""Run identity: what makes two runs (or a run and a baseline) comparable. Analysing wing: stdlib only.

One definition, used by the baseline keys and by ``kvcache compare``'s mismatch check. Each measure
keys on the fields that change it:

- counted passes are bytes of tensor operations: they depend on the model, the dtype and the kind of
  device (``cpu``, ``cuda``: kernels differ in what they are asked to move), not on which CPU or GPU
  model of that kind ran them, nor on the thread count;
- timed passes depend on the machine: the device's name (on a CPU it names the processor and the
  thread count, ``cpu: Intel Xeon (2 threads)``), the model and the dtype;
- counted overhead (ATen ops per step, weight passes) depends on what counted passes depend on and on the
  torch release, whose operator decompositions change op counts: a run on another torch release finds no
  baseline for it rather than a regression.

Fields that later measures add (compile mode, driver, batch, ...) go in :data:`EXTRA_FIELDS` with
their default: a run at the default keeps its key, so baselines recorded before the field existed
stay valid.
"""

from __future__ import annotations

from typing import Any

#: Every field of a run's identity, in display order.
FIELDS = ("device_name", "device_type", "model", "dtype", "threads", "torch")
#: Fields added to the identity after schema 1, with the value a run that predates them had.
EXTRA_FIELDS: dict[str, Any] = {
    "compile": "off",  # --kv-compile: a compiled run never meets an eager baseline
    "driver": "loop",  # --kv-driver: generate() adds its own per-step work
    "batch": 1,  # --kv-batch
    "ragged": False,  # --kv-ragged
}
#: The fields each measure's baseline key and comparability depend on.
MEASURE_FIELDS = {
    "counted": ("device_type", "model", "dtype"),
    "timed": ("device_name", "model", "dtype"),  # a CPU's device name carries its thread count
    "overhead": ("device_type", "model", "dtype", "torch"),
}
#: How a field is spelled in a key, when not by its bare value.
KEY_FORMS = {"torch": "torch {}"}


def of_run(kv: dict[str, Any]) -> dict[str, Any]:
    """The identity of a run from its ``kv`` section (environment and settings)."""
    env, settings = kv.get("environment") or {}, kv.get("settings") or {}
    ident = {
        "device_name": env.get("device_name"), "device_type": env.get("device_type"),
        "model": settings.get("model"), "dtype": settings.get("dtype"), "threads": env.get("threads"),
        "torch": env.get("torch"),
    }
    for name, default in EXTRA_FIELDS.items():  # only when not at its default: a default run keeps its identity
        if settings.get(name, default) != default:
            ident[name] = settings[name]
    return ident


def key(ident: dict[str, Any], measure: str) -> str:
    """The baseline key of ``measure`` for a run of this identity: ``"cpu | tiny | bfloat16"`` (counted),
    ``"cpu: AMD EPYC (2 threads) | tiny | bfloat16"`` (timed), ``"cpu | tiny | bfloat16 | torch 2.13.0+cpu"``
    (overhead). Extra fields appear only when not default."""
    parts = [KEY_FORMS.get(name, "{}").format(ident.get(name)) for name in MEASURE_FIELDS[measure]]
    parts += [f"{name}={ident.get(name)}" for name, default in EXTRA_FIELDS.items()
              if ident.get(name, default) != default]
    return " | ".join(parts)


def mismatches(idents: list[dict[str, Any]], measures: list[str] | tuple[str, ...]) -> dict[str, list[Any]]:
    """Fields (of the given measures, extra fields included) on which the runs differ: {field: [value per run]}."""
    fields = dict.fromkeys(f for m in measures for f in MEASURE_FIELDS[m])
    fields.update(dict.fromkeys(EXTRA_FIELDS))
    if "timed" in measures:
        fields["threads"] = None
    out = {}
    for name in fields:
        values = [i.get(name, EXTRA_FIELDS.get(name)) for i in idents]
        if len(set(map(str, values))) > 1:
            out[name] = values
    return out


def describe(ident: dict[str, Any]) -> str:
    """``"tiny, bfloat16 on cpu: AMD EPYC (2 threads)"``: what a column header or a message names."""
    extra = "".join(f", {name} {ident.get(name)}" for name, default in EXTRA_FIELDS.items()
                    if ident.get(name, default) != default)
    device = ident.get("device_name") or ident.get("device_type")
    return f"{ident.get('model')}, {ident.get('dtype')}{extra} on {device}"
