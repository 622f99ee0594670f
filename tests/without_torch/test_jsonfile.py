"""The one read/write helper of versioned JSON files (kvcache.analysing.records.jsonfile)."""

from __future__ import annotations

import json
import os

import pytest

from kvcache.analysing.records import jsonfile
from kvcache.analysing.records.jsonfile import JSONFileError


class OwnError(ValueError):
    pass


def test_a_document_of_an_accepted_version_loads(tmp_path):
    path = tmp_path / "doc.json"
    path.write_text(json.dumps({"schema": 1, "x": 2}))
    assert jsonfile.load_json(path, accepted=(1, 2), what="thing") == {"schema": 1, "x": 2}


@pytest.mark.parametrize(("text", "says"), [
    ('{"schema": 3}', "doc.json is not a thing (schema 3 is not one of the accepted 1, 2)"),
    ('{"x": 1}', "doc.json is not a thing (schema None is not one of the accepted 1, 2)"),
    ('{"schema": true}', "(schema True is not one of the accepted 1, 2)"),
    ('[1]', "doc.json is not a thing (its top level is a list, expected an object)"),
    ('{"schema": 1', "doc.json: thing is not JSON ("),
])
def test_every_problem_is_one_line_naming_the_file_and_the_accepted_versions(tmp_path, text, says):
    path = tmp_path / "doc.json"
    path.write_text(text)
    with pytest.raises(OwnError) as caught:
        jsonfile.load_json(path, accepted=(1, 2), what="thing", error=OwnError)
    assert says in str(caught.value) and "\n" not in str(caught.value)


def test_a_missing_file_is_the_callers_empty_document_or_an_error(tmp_path):
    path = tmp_path / "none.json"
    assert jsonfile.load_json(path, accepted=(1,), what="thing", missing=lambda: {"schema": 1}) == {"schema": 1}
    with pytest.raises(JSONFileError, match="none.json: cannot read thing"):
        jsonfile.load_json(path, accepted=(1,), what="thing")


def test_a_format_without_a_version_key_accepts_none(tmp_path):
    path = tmp_path / "doc.json"
    path.write_text('{"x": 1}')
    assert jsonfile.load_json(path, key="format", accepted=(None, 1), what="thing") == {"x": 1}
    path.write_text('{"format": 2}')
    with pytest.raises(JSONFileError, match="accepted none, 1"):
        jsonfile.load_json(path, key="format", accepted=(None, 1), what="thing")


def test_written_atomically_with_nan_as_null_and_the_mode_kept(tmp_path):
    path = tmp_path / "doc.json"
    path.write_text("old")
    os.chmod(path, 0o640)
    jsonfile.write_json(path, {"schema": 1, "b": float("nan"), "a": 1}, indent=2, sort_keys=True)
    assert path.read_text() == '{\n  "a": 1,\n  "b": null,\n  "schema": 1\n}\n'
    assert os.stat(path).st_mode & 0o777 == 0o640
    assert [p.name for p in tmp_path.iterdir()] == ["doc.json"]  # no temp file left


def test_a_file_that_cannot_be_written_is_one_line(tmp_path):
    folder = tmp_path / "file"
    folder.write_text("")
    with pytest.raises(OwnError, match="cannot write thing"):
        jsonfile.write_json(folder / "doc.json", {}, what="thing", error=OwnError)
    with pytest.raises(OSError):
        jsonfile.write_json(folder / "doc.json", {}, error=None)


def test_update_reads_changes_and_writes_under_the_lock(tmp_path):
    path = tmp_path / "doc.json"

    def load(p):
        return jsonfile.load_json(p, accepted=(1,), what="thing", missing=lambda: {"schema": 1, "n": 0})

    def write(p, doc):
        jsonfile.write_json(p, doc)

    for _ in range(3):
        jsonfile.update_json(path, lambda doc: {**doc, "n": doc["n"] + 1}, load=load, write=write)
    assert json.loads(path.read_text()) == {"schema": 1, "n": 3}
    jsonfile.update_json(path, lambda doc: {**doc, "n": 0}, load=load, write=write, lock=jsonfile.sibling_lock)
    assert json.loads(path.read_text())["n"] == 0 and (tmp_path / "doc.json.lock").exists()
