"""report.html: one self-contained page (no network): the interactive latency chart, the context slider and the
document's tables, with report.css, report.js (package data files beside this module) and the chart data
inlined at render time. Nothing for tests ships in it: a test that drives the page injects its own script.

Every string from a run is escaped: text of the page through :func:`~kvcache.analysing.report.documents.html_text`,
the chart data through :func:`script_json` (no ``<``, ``>`` or ``&`` inside the data's ``<script>`` element)."""

from __future__ import annotations

import json
from functools import cache
from importlib import resources

from kvcache.analysing import tables
from kvcache.analysing.records import Run
from kvcache.analysing.report.data import chart_data, dtype, model_name
from kvcache.analysing.report.documents import Doc, html_text, to_html

ASSETS = ("report.css", "report.js")


@cache
def asset(name: str) -> str:
    """The text of a package data file of this package; it must not close the element it is inlined into."""
    text = resources.files(__package__).joinpath(name).read_text(encoding="utf-8")
    if "</script" in text.lower() or "</style" in text.lower():
        raise ValueError(f"{name} closes its <script>/<style> element")
    return text


# In a <script> element, "</script" ends it and "<!--" with "<script" makes later markup part of it: inside the JSON
# (only in its strings) these characters are written as \u escapes, which JSON.parse reads back unchanged.
# U+2028/U+2029 too, for any reader that takes the data as JavaScript.
_SCRIPT_UNSAFE = str.maketrans({ch: f"\\u{ord(ch):04x}" for ch in "<>&\u2028\u2029"})


def script_json(data: object) -> str:
    """``data`` as JSON to inline in a ``<script type="application/json">`` element: ``< > &`` and U+2028/U+2029
    as ``\\uXXXX`` escapes, so no string in it can close the element, open a comment or inject markup; control and
    bidirectional formatting characters in its strings (keys too) shown as their code, as
    :func:`~kvcache.analysing.report.documents.html_text` shows them, since the page's script puts them in the
    page as text (a class name with U+202E would be drawn backwards)."""
    text = json.dumps(_visible(data), separators=(",", ":"), allow_nan=False)
    return text.translate(_SCRIPT_UNSAFE)


def _visible(data: object) -> object:
    """``data`` with every string in it (keys included) through :func:`kvcache.analysing.tables.visible`."""
    if isinstance(data, str):
        return tables.visible(data)
    if isinstance(data, dict):
        return {_visible(k): _visible(v) for k, v in data.items()}
    if isinstance(data, (list, tuple)):
        return [_visible(v) for v in data]
    return data


def render_html(runs: list[Run], doc: Doc) -> str:
    """report.html: the document's title once (the page's <h1>), the chart, the document's blocks; CSS, JS and data
    inlined."""
    data = chart_data(runs)
    n = len(data["contexts"])
    payload = script_json(data)
    beyond = ""
    if data["trained_beyond"]:
        beyond = (f'<p class="note">trained context {", ".join(f"{t:,}" for t in data["trained_beyond"])} tokens '
                  "lies beyond the measured contexts (not drawn)</p>")
    what = html_text(", ".join(dict.fromkeys(f"{model_name(run.record)}, {dtype(run.record)}" for run in runs)))
    disabled = "" if n else " disabled"
    return f"""<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{html_text(doc.title)}</title>
<style>{asset("report.css")}</style>
</head>
<body>
<h1>{html_text(doc.title)}</h1>
<section class="chart-box">
<h2>Median step time against context{f" — {what}" if what else ""}</h2>
<p class="note">Points: median of each (context, round) with its IQR; lines join the per-context medians.
Grey dashed vertical line: the model's trained context. Solid blue vertical line: the context picked with the slider.
Hover a point for its values; click a legend entry to hide it.</p>
<div id="latency-chart" class="chart"></div>
<div id="chart-legend" class="legend"></div>
{beyond}
<div class="slider-row"><label for="context-slider">Context</label>
<input type="range" id="context-slider" min="0" max="{max(n - 1, 0)}" step="1" value="{max(n - 1, 0)}"{disabled}>
<span id="slider-value"></span></div>
<div id="slider-readout" aria-live="polite"></div>
</section>
{to_html(doc)}
<script type="application/json" id="report-data">{payload}</script>
<script>{asset("report.js")}</script>
</body>
</html>
"""
