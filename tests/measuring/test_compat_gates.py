"""The compat layer on a commit between releases (``kvcache bisect``'s probes): gates that can be asked of the code
are, and a comparison a development version cannot answer is noted, with its place, for the probe to report."""

from __future__ import annotations

import inspect

import pytest

from kvcache.measuring import compat


@pytest.fixture
def fresh_notes(monkeypatch):
    monkeypatch.setattr(compat.version, "AMBIGUOUS", {})
    return compat.version.AMBIGUOUS


def gate_at_24(version):
    return version >= (5, 24)


def test_a_development_version_notes_a_gate_on_its_own_release(fresh_notes):
    version = compat.InstalledVersion("5.24.0.dev0")
    assert tuple(version) == (5, 24, 0) and version.development
    assert gate_at_24(version) is True  # answered as the release would answer it, but noted
    assert version < (5, 24, 1) and version >= (5, 19) and version < (6, 0)  # other releases' numbers: exact
    [(where, why)] = fresh_notes.items()
    assert where.endswith(".gate_at_24:" + str(inspect.getsourcelines(gate_at_24)[1] + 1))
    assert why == f"{where} gates on transformers >= 5.24, which 5.24.0.dev0 (a commit between releases) cannot answer"
    assert compat.ambiguous_gates() == [why]


@pytest.mark.parametrize("text", ["5.24.0", "4.57.1", "5.24.0+local"])
def test_a_release_notes_nothing(fresh_notes, text):
    version = compat.InstalledVersion(text)
    assert not version.development
    assert gate_at_24(version) is (version[:2] >= (5, 24))
    assert version < (4, 46) or version >= (4, 46)
    assert fresh_notes == {}


def test_rc_and_dev_are_development_versions():
    for text in ("5.24.0.dev0", "5.24.0rc1", "4.46.0.dev0"):
        assert compat.InstalledVersion(text).development, text


def test_the_installed_version_is_one_and_keeps_its_tuple_behaviour():
    assert isinstance(compat.VERSION, compat.InstalledVersion)
    assert tuple(compat.VERSION) == compat.parse_version(compat.TRANSFORMERS)
    assert compat.VERSION[:2] == tuple(compat.VERSION)[:2] and hash(compat.VERSION) == hash(tuple(compat.VERSION))


def reflected(version):
    return (5, 24) <= version


def equal(version):
    return version == (5, 24, 0)


def unequal(version):
    return version != (5, 24, 0)


def sliced(version):
    return version[:2] >= (5, 24)


def part(version):
    return version[1] >= 24


def part_reflected(version):
    return 24 > version[1]


@pytest.mark.parametrize(("gate", "op", "wanted", "answer"), [
    (reflected, ">=", "5.24", True), (equal, "==", "5.24.0", True), (unequal, "!=", "5.24.0", False),
    (sliced, ">=", "5.24", True), (part, ">=", "24 (part 1 of the version)", True),
    (part_reflected, "<", "24 (part 1 of the version)", False),
])
def test_every_form_of_a_gate_on_its_own_release_is_noted(fresh_notes, gate, op, wanted, answer):
    """Reflected comparisons, == and !=, a slice and one part of the version: each used to be answered silently
    (only ``VERSION OP tuple`` with <, <=, >, >= was noted)."""
    assert gate(compat.InstalledVersion("5.24.0.dev0")) is answer
    [(where, why)] = fresh_notes.items()
    assert where == f"{__name__}.{gate.__name__}:{inspect.getsourcelines(gate)[1] + 1}"
    assert why == (f"{where} gates on transformers {op} {wanted}, which 5.24.0.dev0 (a commit between releases) "
                   "cannot answer")


def test_other_numbers_and_parts_stay_exact(fresh_notes):
    version = compat.InstalledVersion("5.24.0.dev0")
    assert version[:2] >= (5, 19) and version[:1] == (5,) and version[0] >= 5 and version[1] > 20
    assert version != (4, 57) and version[-3] == 5
    assert compat.InstalledVersion("5.24.1.dev0")[:2] >= (5, 24)  # after the 5.24 release: exact
    assert isinstance(version[:2], compat.InstalledVersion) and hash(version[:2]) == hash((5, 24))
    assert fresh_notes == {}


def test_the_paged_gate_goes_through_the_compat_layer(fresh_notes):
    from kvcache.measuring import paged_point

    since = ".".join(map(str, paged_point.PAGED_SINCE))
    assert paged_point.unsupported_reason(since + ".dev0") is None
    [why] = fresh_notes.values()
    assert why.startswith("kvcache.measuring.paged_point.unsupported_reason:") and f"< {since}," in why


def test_gates_asked_of_the_code():
    """The dtype keyword and the attention registry come from the source, and agree with the release numbers that
    were gated on before (4.56, 4.48)."""
    assert compat.dtype_keyword() == ("dtype" if compat.VERSION >= (4, 56) else "torch_dtype")
    assert compat.has_attention_registry() == (compat.VERSION >= (4, 48))
