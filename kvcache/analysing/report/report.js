// report.html's chart: draws the embedded #report-data, hover tooltips, legend toggles and the context slider.
(function () {
  "use strict";
  var data = JSON.parse(document.getElementById("report-data").textContent);
  var NS = "http://www.w3.org/2000/svg";
  var chart = document.getElementById("latency-chart");
  var slider = document.getElementById("context-slider");
  var sliderValue = document.getElementById("slider-value");
  var readout = document.getElementById("slider-readout");
  var legend = document.getElementById("chart-legend");
  var W = 900, H = 420, M = {l: 64, r: 20, t: 16, b: 48};
  function fmt(v, d) { return (v === null || v === undefined || !isFinite(v)) ? "\u2014" : Number(v).toFixed(d); }
  function el(tag, attrs, parent, text) {
    var e = document.createElementNS(NS, tag);
    Object.keys(attrs || {}).forEach(function (k) { e.setAttribute(k, attrs[k]); });
    if (text !== undefined) e.textContent = text;
    if (parent) parent.appendChild(e);
    return e;
  }
  function ticks(max, n) {
    if (!(max > 0)) return [0];
    var raw = max / n, p = Math.pow(10, Math.floor(Math.log10(raw))), f = raw / p;
    var step = (f < 1.5 ? 1 : f < 3 ? 2 : f < 7 ? 5 : 10) * p, out = [];
    for (var i = 0; i * step <= max * 1.0001; i++) out.push(i * step);
    return out;
  }
  var X = function (c) { return M.l + c / data.xmax * (W - M.l - M.r); };
  var Y = function (v) { return H - M.b - v / data.ymax * (H - M.t - M.b); };
  var svg = el("svg", {viewBox: "0 0 " + W + " " + H, "aria-label": "median step time against context"}, chart);
  var grid = el("g", {"class": "grid"}, svg), axes = el("g", {"class": "axis"}, svg);
  ticks(data.ymax, 6).forEach(function (v) {
    el("line", {x1: M.l, x2: W - M.r, y1: Y(v), y2: Y(v)}, grid);
    el("text", {x: M.l - 6, y: Y(v) + 4, "text-anchor": "end"}, axes, v >= 10 ? v.toFixed(0) : String(+v.toFixed(2)));
  });
  ticks(data.xmax, 8).forEach(function (c) {
    el("line", {x1: X(c), x2: X(c), y1: M.t, y2: H - M.b}, grid);
    el("text", {x: X(c), y: H - M.b + 16, "text-anchor": "middle"}, axes, c.toLocaleString("en-US"));
  });
  el("line", {x1: M.l, x2: W - M.r, y1: H - M.b, y2: H - M.b}, axes);
  el("line", {x1: M.l, x2: M.l, y1: M.t, y2: H - M.b}, axes);
  el("text", {x: (M.l + W - M.r) / 2, y: H - 10, "text-anchor": "middle"}, axes, "context (tokens)");
  el("text", {x: 14, y: (M.t + H - M.b) / 2, "text-anchor": "middle",
              transform: "rotate(-90 14 " + (M.t + H - M.b) / 2 + ")"}, axes, "median step time (ms)");
  data.trained.forEach(function (t) {
    el("line", {"class": "trained", x1: X(t), x2: X(t), y1: M.t, y2: H - M.b}, svg);
    el("text", {x: X(t) - 4, y: M.t + 12, "text-anchor": "end", "class": "trained-label"}, svg,
       "trained context " + t.toLocaleString("en-US"));
  });
  if (!data.contexts.length) {
    el("text", {x: (M.l + W - M.r) / 2, y: (M.t + H - M.b) / 2, "text-anchor": "middle", "class": "empty"}, svg,
       "no timed points in this run");
  }
  var cursor = el("line", {"class": "cursor", x1: 0, x2: 0, y1: M.t, y2: H - M.b, visibility: "hidden"}, svg);
  var cursorLabel = el("text", {"class": "cursor-label", x: 0, y: H - M.b - 6, visibility: "hidden"}, svg);
  var tip = document.createElement("div");
  tip.className = "tooltip";
  tip.id = "chart-tooltip";
  chart.appendChild(tip);
  function showTip(evt, s, p) {
    var lines = [s.label, "context " + p.context.toLocaleString("en-US") + " tokens, round " + p.round,
                 "median " + fmt(p.median_ms, 2) + " ms (IQR " + fmt(p.q25_ms, 2) + "\u2013" + fmt(p.q75_ms, 2) + ")",
                 "KV cache " + fmt(p.kv_mb, 2) + " MB"];
    if (p.counted_mb !== null && p.counted_mb !== undefined) lines.push("counted " + fmt(p.counted_mb, 2) + " MB");
    if (p.beyond) lines.push("beyond the trained context");
    tip.textContent = "";
    lines.forEach(function (line) { var d = document.createElement("div"); d.textContent = line; tip.appendChild(d); });
    var r = chart.getBoundingClientRect();
    var x = (evt.clientX || r.left + r.width / 2) - r.left + 12, y = (evt.clientY || r.top + r.height / 2) - r.top + 12;
    tip.style.left = Math.min(x, Math.max(0, r.width - 260)) + "px";
    tip.style.top = y + "px";
    tip.style.display = "block";
  }
  function hideTip() { tip.style.display = "none"; }
  data.series.forEach(function (s) {
    var g = el("g", {"class": "series", "data-series": s.id}, svg);
    if (s.medians.length > 1) {
      var d = s.medians.map(function (m, i) {
        return (i ? "L" : "M") + X(m.context).toFixed(1) + " " + Y(m.median_ms).toFixed(1);
      });
      el("path", {d: d.join(" "), stroke: s.colour, "stroke-dasharray": s.dash}, g);
    }
    s.points.forEach(function (p) {
      if (p.q25_ms !== null && p.q75_ms !== null) {
        el("line", {x1: X(p.context), x2: X(p.context), y1: Y(p.q25_ms), y2: Y(p.q75_ms), stroke: s.colour,
                    "stroke-width": 1.5}, g);
      }
      var c = el("circle", {"class": "pt", cx: X(p.context), cy: Y(p.median_ms), r: 5, fill: s.colour}, g);
      c.addEventListener("mouseenter", function (evt) { showTip(evt, s, p); });
      c.addEventListener("mousemove", function (evt) { showTip(evt, s, p); });
      c.addEventListener("mouseleave", hideTip);
    });
    var b = document.createElement("button");
    b.type = "button";
    b.title = "show or hide this series";
    var sw = el("svg", {"class": "swatch", width: 24, height: 8, viewBox: "0 0 24 8"}, b);
    el("line", {x1: 0, x2: 24, y1: 4, y2: 4, stroke: s.colour, "stroke-width": 3, "stroke-dasharray": s.dash}, sw);
    b.appendChild(document.createTextNode(s.label + (s.points.length ? "" : " (no timed points)")));
    b.addEventListener("click", function () {
      var off = b.classList.toggle("off");
      g.style.display = off ? "none" : "";
    });
    legend.appendChild(b);
  });
  function update() {
    readout.textContent = "";
    if (!data.contexts.length) { readout.textContent = "no measured contexts in this run"; return; }
    var ctx = data.contexts[Math.max(0, Math.min(data.contexts.length - 1, +slider.value))];
    sliderValue.textContent = ctx.toLocaleString("en-US") + " tokens";
    cursor.setAttribute("x1", X(ctx));
    cursor.setAttribute("x2", X(ctx));
    cursor.setAttribute("visibility", "visible");
    var labelLeft = X(ctx) > W - M.r - 120;
    cursorLabel.setAttribute("x", labelLeft ? X(ctx) - 4 : X(ctx) + 4);
    cursorLabel.setAttribute("text-anchor", labelLeft ? "end" : "start");
    cursorLabel.textContent = "slider " + ctx.toLocaleString("en-US");
    cursorLabel.setAttribute("visibility", "visible");
    var table = document.createElement("table"), head = table.createTHead().insertRow();
    ["context " + ctx.toLocaleString("en-US") + " tokens", "median ms", "KV MB", "counted MB", "rounds"].forEach(
      function (h) { var th = document.createElement("th"); th.textContent = h; head.appendChild(th); });
    var body = table.createTBody();
    data.series.forEach(function (s) {
      var row = body.insertRow(), m = null;
      s.medians.forEach(function (x) { if (x.context === ctx) m = x; });
      var why = s.skipped[String(ctx)] || s.skipped_class;
      var cells = m ? [s.label, fmt(m.median_ms, 2), fmt(m.kv_mb, 2), fmt(m.counted_mb, 2), String(m.rounds)]
        : [s.label, why ? "skipped: " + why : "not measured at this context", "\u2014", "\u2014", "\u2014"];
      cells.forEach(function (text) { row.insertCell().textContent = text; });
    });
    readout.appendChild(table);
  }
  slider.addEventListener("input", update);
  slider.addEventListener("change", update);
  update();
})();
