// Injected by tests/without_torch/test_report_page.py into a copy of report.html, after the page's own script: drives the
// chart (slider, hover), lists what could have been injected (tag names, on* attributes, scripts) and writes what it
// found as JSON into a pre element (id "selftest"). Never shipped in the report.
(function () {
  "use strict";
  var chart = document.getElementById("latency-chart");
  var slider = document.getElementById("context-slider");
  var readout = document.getElementById("slider-readout");
  var tip = document.getElementById("chart-tooltip");
  var data = JSON.parse(document.getElementById("report-data").textContent);
  var result = {chart: !!chart, svg: chart.querySelectorAll("svg").length,
                points: chart.querySelectorAll("circle.pt").length,
                lines: chart.querySelectorAll(".series path").length,
                trained: chart.querySelectorAll("line.trained").length,
                contexts: data.contexts.length, before: readout.textContent};
  slider.value = String(+slider.value === 0 ? data.contexts.length - 1 : 0);
  slider.dispatchEvent(new Event("input", {bubbles: true}));
  result.after = readout.textContent;
  result.changed = result.before !== result.after;
  var first = chart.querySelector("circle.pt");
  if (first) {
    first.dispatchEvent(new MouseEvent("mouseenter", {clientX: 100, clientY: 100}));
    result.tooltip = tip.textContent;
    tip.style.display = "none";
  }
  // What could have been injected: every tag name on the page, event-handler attributes, script elements.
  var all = document.getElementsByTagName("*"), tags = {};
  result.handlers = [];
  Array.prototype.forEach.call(all, function (e) {
    tags[e.localName] = true;
    Array.prototype.forEach.call(e.attributes, function (a) {
      if (/^on/i.test(a.name)) result.handlers.push(e.localName + "[" + a.name + "]");
    });
  });
  result.tags = Object.keys(tags).sort();
  result.scripts = document.scripts.length;
  result.title = document.querySelector(".chart-box h2").textContent;
  result.legend = Array.prototype.map.call(document.querySelectorAll("#chart-legend button"),
                                           function (b) { return b.textContent; });
  result.errors = window.__kvErrors || [];
  var pre = document.createElement("pre");
  pre.id = "selftest";
  pre.textContent = JSON.stringify(result);
  document.body.appendChild(pre);
})();
