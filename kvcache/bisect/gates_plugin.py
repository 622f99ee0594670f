"""A pytest plugin for the probes of ``kvcache bisect`` (``-p kvcache.bisect.gates_plugin --kvbisect-gates OUT.json``):
at the end of the session it writes to OUT.json the Transformers version the run imported and the version gates it
took that this version cannot answer (:func:`kvcache.measuring.compat.ambiguous_gates`: a commit between two
releases reports the next release's number, ``5.24.0.dev0``, whatever that release's cycle has merged so far).
Standard library only; it reads the compat layer only when the run imported it."""

from __future__ import annotations

import json
import sys


def pytest_addoption(parser) -> None:
    parser.addoption("--kvbisect-gates", default=None, metavar="OUT.json",
                     help="kvcache bisect: write the version gates the run could not trust to OUT.json")


def pytest_sessionfinish(session, exitstatus) -> None:
    path = session.config.getoption("kvbisect_gates")
    if not path:
        return
    compat = sys.modules.get("kvcache.measuring.compat")
    found = {"transformers": getattr(compat, "TRANSFORMERS", None),
             "ambiguous": compat.ambiguous_gates() if compat is not None else []}
    with open(path, "w", encoding="utf-8") as out:
        json.dump(found, out)
