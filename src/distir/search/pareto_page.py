"""The interactive page's template (``distir.search.pareto.write_html``): HTML with
``__TITLE__``, ``__SUMMARY__``, ``__BODY__``, ``__CSS__``, ``__JS__`` and ``__DATA__``
placeholders, filled in one pass; the script reads the results from the ``distir-data`` JSON
block and sets strategy names only as text."""

PAGE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>__TITLE__</title>
<style>__CSS__</style>
</head>
<body>
<h1>__TITLE__</h1>
<p id="summary">__SUMMARY__</p>
__BODY__
<script type="application/json" id="distir-data">__DATA__</script>
<script>__JS__</script>
</body>
</html>
"""

BODY = """<div id="chart-wrap">
<svg id="chart" viewBox="0 0 900 500" role="img" aria-label="peak memory against throughput"></svg>
<div id="tip" hidden></div>
</div>
<div class="legend">
<span><svg width="14" height="14"><circle cx="7" cy="7" r="5" class="fit"/></svg>fits, simulated</span>
<span><svg width="14" height="14"><path d="M7 1.5 L12.5 11.5 L1.5 11.5 Z" class="fit"/></svg>fits,
 screen only</span>
<span><svg width="14" height="14"><circle cx="7" cy="7" r="5" class="oom"/></svg>out of memory,
 simulated</span>
<span><svg width="14" height="14"><path d="M7 1.5 L12.5 11.5 L1.5 11.5 Z" class="oom"/></svg>out of memory,
 screen only</span>
<span><svg width="22" height="14"><path d="M1 11 H9 V4 H21" class="front-line"/></svg>Pareto front</span>
<span><svg width="14" height="14"><path d="M7 0 V14" class="cap-line"/></svg>memory capacity</span>
<span><svg width="16" height="16"><polygon class="best" points="8,0.5 9.9,5.4 15.1,5.6 11,8.9 12.4,14 8,11.1
 3.6,14 5,8.9 0.9,5.6 6.1,5.4"/></svg>best that fits</span>
</div>
<p class="hint">Hover a point for details. Click a point or a table row to highlight both.
 Click a column header to sort.</p>
<div id="table-wrap"><table id="results"><thead></thead><tbody></tbody></table></div>
<noscript><p>The chart and table need JavaScript.</p></noscript>"""

CSS = """
body { font: 14px/1.4 system-ui, -apple-system, "Segoe UI", sans-serif; margin: 1.5em; color: #222; }
h1 { font-size: 1.3em; margin: 0 0 .3em; }
#summary { margin: 0 0 1em; }
.empty { font-size: 1.4em; color: #777; }
#chart-wrap { position: relative; max-width: 900px; }
#chart { width: 100%; height: auto; display: block; border: 1px solid #ddd; background: #fff; }
#chart text { font-size: 11px; fill: #333; }
#chart .axis-label { font-size: 13px; }
#chart .grid { stroke: #e6e6e6; }
#chart .frame { fill: none; stroke: #999; }
#chart .flabel { font-size: 10px; fill: #222; paint-order: stroke; stroke: #fff; stroke-width: 3px;
  pointer-events: none; }
#chart .cap-text { fill: #d62728; }
.fit { fill: #1f77b4; stroke: #fff; stroke-width: .8; }
.oom { fill: #fff; stroke: #d62728; stroke-width: 1.5; }
.front-line { fill: none; stroke: #404040; stroke-width: 1.5; }
.cap-line { fill: none; stroke: #d62728; stroke-width: 1.2; stroke-dasharray: 6 4; }
.best { fill: #ffbf00; stroke: #000; stroke-width: .8; }
#chart .pt { cursor: pointer; }
#chart .pt.sel { stroke: #000; stroke-width: 3; }
#chart .pt.sel.oom { stroke: #8b0000; }
.legend { display: flex; flex-wrap: wrap; gap: .4em 1.2em; margin: .5em 0; font-size: 12px; }
.legend span { display: inline-flex; align-items: center; gap: .35em; }
.hint { color: #666; font-size: 12px; margin: .3em 0 .8em; }
#tip { position: absolute; pointer-events: none; background: rgba(255,255,255,.97); border: 1px solid #999;
  border-radius: 4px; padding: .4em .6em; font-size: 12px; box-shadow: 0 2px 6px rgba(0,0,0,.15);
  white-space: nowrap; z-index: 2; }
#tip b { display: block; margin-bottom: .2em; }
#table-wrap { overflow-x: auto; }
table { border-collapse: collapse; font-size: 12.5px; }
th, td { padding: .25em .6em; border-bottom: 1px solid #eee; text-align: right; white-space: nowrap; }
th { position: sticky; top: 0; background: #f4f4f4; cursor: pointer; user-select: none; }
th:hover { background: #e8e8e8; }
td.s, th.s { text-align: left; font-family: ui-monospace, SFMono-Regular, Menlo, monospace; }
tbody tr { cursor: pointer; }
tbody tr:hover { background: #f5f9ff; }
tr.front td.s { font-weight: 600; }
tr.front { background: #f3faf3; }
tr.oom td.fits { color: #d62728; }
tr.sel, tr.sel:hover { background: #fff3b0; }
"""

JS = r"""
(function () {
  "use strict";
  const data = JSON.parse(document.getElementById("distir-data").textContent);
  const rows = data.rows;
  const svg = document.getElementById("chart");
  if (!svg || rows.length === 0) return;
  const NS = "http://www.w3.org/2000/svg";
  const GIB = 1073741824;
  const W = 900, H = 500, M = { l: 80, r: 24, t: 18, b: 52 };

  const fin = (v) => typeof v === "number" && isFinite(v);
  const pct = (v) => (fin(v) ? (100 * v).toFixed(1) + "%" : "\u2014");
  const gib = (v) => (fin(v) ? (v / GIB).toFixed(2) + " GiB" : "\u2014");
  const num = (v, dp) =>
    fin(v) ? v.toLocaleString("en-US", { minimumFractionDigits: dp, maximumFractionDigits: dp }) : "\u2014";
  const secs = (v) => (!fin(v) ? "\u2014" : v < 1 ? (1000 * v).toFixed(2) + " ms" : v.toFixed(3) + " s");
  const int = (v) => (v === null || v === undefined ? "\u2014" : String(v));
  const src = (v) => (v === "simulated" ? "simulated" : v === "screen" ? "screen (analytic)" : v || "\u2014");

  function el(tag, attrs, parent) {
    const e = document.createElementNS(NS, tag);
    for (const k in attrs) e.setAttribute(k, attrs[k]);
    if (parent) parent.appendChild(e);
    return e;
  }

  // "Nice" ticks: steps of 1, 2 or 5 times a power of ten, about n of them across [lo, hi].
  function ticks(lo, hi, n) {
    const raw = (hi - lo) / n;
    const p = Math.pow(10, Math.floor(Math.log10(raw)));
    const step = [1, 2, 5, 10].map((m) => m * p).find((s) => s >= raw) || 10 * p;
    const out = [];
    for (let v = Math.ceil(lo / step) * step; v <= hi + step * 1e-9; v += step) out.push(+v.toPrecision(12));
    return out;
  }

  const shown = rows.filter((r) => fin(r.peak_memory_bytes) && fin(r.throughput));
  const cap = data.capacity;
  const xs = shown.map((r) => r.peak_memory_bytes / GIB);
  const ys = shown.map((r) => r.throughput);
  let x1 = Math.max(0, ...xs, cap ? cap.bytes / GIB : 0) * 1.06 || 1;
  let y0 = Math.min(...ys), y1 = Math.max(...ys);
  const pad = (y1 - y0) * 0.08 || Math.abs(y1) * 0.1 || 1;
  y0 -= pad; y1 += pad;
  if (y0 < 0 && Math.min(...ys) >= 0) y0 = 0;
  if (!shown.length) { y0 = 0; y1 = 1; }
  const sx = (v) => M.l + (v / x1) * (W - M.l - M.r);
  const sy = (v) => H - M.b - ((v - y0) / (y1 - y0)) * (H - M.t - M.b);

  const axes = el("g", {}, svg);
  for (const t of ticks(0, x1, 8)) {
    el("line", { class: "grid", x1: sx(t), x2: sx(t), y1: M.t, y2: H - M.b }, axes);
    el("text", { x: sx(t), y: H - M.b + 16, "text-anchor": "middle" }, axes).textContent = +t.toPrecision(6);
  }
  for (const t of ticks(y0, y1, 6)) {
    el("line", { class: "grid", x1: M.l, x2: W - M.r, y1: sy(t), y2: sy(t) }, axes);
    el("text", { x: M.l - 6, y: sy(t) + 4, "text-anchor": "end" }, axes).textContent =
      t.toLocaleString("en-US", { maximumFractionDigits: 6 });
  }
  el("rect", { class: "frame", x: M.l, y: M.t, width: W - M.l - M.r, height: H - M.t - M.b }, axes);
  el("text", { class: "axis-label", x: (M.l + W - M.r) / 2, y: H - 12, "text-anchor": "middle" }, axes)
    .textContent = "peak memory per device (GiB)";
  el("text", { class: "axis-label", transform: `translate(16 ${(M.t + H - M.b) / 2}) rotate(-90)`,
    "text-anchor": "middle" }, axes).textContent = "throughput (samples/s)";
  if (!shown.length) {
    el("text", { x: W / 2, y: H / 2, "text-anchor": "middle", class: "axis-label" }, axes).textContent =
      "no plottable results (non-finite memory or throughput)";
  }

  if (cap) {
    const cx = sx(cap.bytes / GIB);
    el("line", { class: "cap-line", x1: cx, x2: cx, y1: M.t, y2: H - M.b }, axes);
    el("text", { class: "cap-text", x: cx - 5, y: M.t + 14, "text-anchor": "end" }, axes).textContent =
      (cap.uniform ? "device memory " : "smallest device memory ") + (cap.bytes / GIB).toPrecision(3) +
      " GiB" + (cap.uniform ? "" : " (varies)");
  }

  const front = shown.filter((r) => r.front).sort((a, b) => a.peak_memory_bytes - b.peak_memory_bytes);
  if (front.length) {
    // Step "post": from each front point the best attainable throughput holds until the next.
    let d = `M${sx(front[0].peak_memory_bytes / GIB)} ${sy(front[0].throughput)}`;
    for (const r of front.slice(1)) d += ` H${sx(r.peak_memory_bytes / GIB)} V${sy(r.throughput)}`;
    d += ` H${sx(Math.max(...xs))}`;
    el("path", { class: "front-line", d: d }, axes);
  }

  const marks = new Map(); // row index -> SVG elements standing for it
  const tip = document.getElementById("tip");
  const wrap = document.getElementById("chart-wrap");
  function showTip(r, ev) {
    tip.replaceChildren();
    const b = document.createElement("b");
    b.textContent = r.strategy;
    tip.appendChild(b);
    const mem = gib(r.peak_memory_bytes) + (fin(r.capacity_bytes) ? " of " + gib(r.capacity_bytes) +
      " (" + pct(r.peak_memory_bytes / r.capacity_bytes) + ")" : "");
    const lines = [
      ["step time", secs(r.step_time_s)], ["throughput", num(r.throughput, 1) + " samples/s"],
      ["MFU", pct(r.mfu)], ["HFU", pct(r.hfu)], ["peak memory", mem], ["bubble", pct(r.bubble_fraction)],
      ["fits", r.fits ? "yes" : "no (out of memory)"], ["source", src(r.source)],
    ];
    if (r.front) lines.push(["", "on the Pareto front"]);
    if (r.best) lines.push(["", "best that fits"]);
    for (const [k, v] of lines) {
      const div = document.createElement("div");
      div.textContent = k ? k + ": " + v : v;
      tip.appendChild(div);
    }
    tip.hidden = false;
    const box = wrap.getBoundingClientRect();
    let left = ev.clientX - box.left + 14, top = ev.clientY - box.top + 14;
    if (left + tip.offsetWidth > box.width) left = ev.clientX - box.left - tip.offsetWidth - 14;
    if (top + tip.offsetHeight > box.height) top = ev.clientY - box.top - tip.offsetHeight - 14;
    tip.style.left = Math.max(0, left) + "px";
    tip.style.top = Math.max(0, top) + "px";
  }
  function hook(node, r) {
    node.addEventListener("mouseenter", (ev) => showTip(r, ev));
    node.addEventListener("mousemove", (ev) => showTip(r, ev));
    node.addEventListener("mouseleave", () => { tip.hidden = true; });
    node.addEventListener("click", () => select(r.i, true));
    if (!marks.has(r.i)) marks.set(r.i, []);
    marks.get(r.i).push(node);
  }

  const pts = el("g", {}, svg);
  // Out-of-memory (hollow) points first, so filled fitting points are not hidden under them.
  for (const r of [...shown].sort((a, b) => a.fits - b.fits)) {
    const x = sx(r.peak_memory_bytes / GIB), y = sy(r.throughput);
    const cls = "pt " + (r.fits ? "fit" : "oom");
    const node = r.source === "simulated"
      ? el("circle", { cx: x, cy: y, r: 5, class: cls }, pts)
      : el("path", { d: `M${x} ${y - 6} L${x + 5.5} ${y + 4} L${x - 5.5} ${y + 4} Z`, class: cls }, pts);
    hook(node, r);
  }
  for (const r of front.filter((r) => r.label)) {
    el("text", { class: "flabel", x: sx(r.peak_memory_bytes / GIB) - 6, y: sy(r.throughput) - 7,
      "text-anchor": "end" }, pts).textContent = r.strategy;
  }
  const best = shown.find((r) => r.best);
  if (best) {
    const cx = sx(best.peak_memory_bytes / GIB), cy = sy(best.throughput);
    const star = [];
    for (let k = 0; k < 10; k++) {
      const a = -Math.PI / 2 + (k * Math.PI) / 5, rad = k % 2 ? 4.2 : 10;
      star.push((cx + rad * Math.cos(a)).toFixed(2) + "," + (cy + rad * Math.sin(a)).toFixed(2));
    }
    hook(el("polygon", { points: star.join(" "), class: "pt best" }, pts), best);
  }

  // --- table
  const cols = [
    ["i", "#", int], ["strategy", "strategy", String], ["d", "D", int], ["t", "T", int], ["p", "P", int],
    ["k", "K", int], ["step_time_s", "step time", secs], ["throughput", "samples/s", (v) => num(v, 1)],
    ["mfu", "MFU", pct], ["hfu", "HFU", pct], ["peak_memory_bytes", "peak memory", gib],
    ["capacity_bytes", "capacity", gib],
    ["bubble_fraction", "bubble", pct], ["fits", "fits", (v) => (v ? "yes" : "no")],
    ["source", "source", src], ["front", "front", (v) => (v ? "\u25cf" : "")],
  ];
  const table = document.getElementById("results");
  const tbody = table.tBodies[0];
  const trs = new Map();
  const headRow = table.tHead.insertRow();
  for (const [key, label] of cols) {
    const th = document.createElement("th");
    th.textContent = label;
    th.dataset.key = key;
    th.title = "sort by " + label;
    if (key === "strategy") th.className = "s";
    th.addEventListener("click", () => sortBy(key));
    headRow.appendChild(th);
  }
  for (const r of rows) {
    const tr = tbody.insertRow();
    tr.className = (r.front ? "front " : "") + (r.fits ? "" : "oom");
    for (const [key, , f] of cols) {
      const td = tr.insertCell();
      td.textContent = f(r[key]);
      if (key === "strategy") td.className = "s";
      if (key === "fits") td.className = "fits";
    }
    if (r.best) tr.cells[1].textContent += " \u2605";
    tr.addEventListener("click", () => select(r.i, false));
    trs.set(r.i, tr);
  }

  let sortKey = null, sortDir = 1;
  function sortBy(key) {
    sortDir = key === sortKey ? -sortDir : 1;
    sortKey = key;
    const cmp = (a, b) => {
      const u = a[key], v = b[key];
      const nu = u === null || u === undefined, nv = v === null || v === undefined;
      if (nu || nv) return nu - nv; // missing values last in either direction
      const c = typeof u === "string" ? u.localeCompare(v) : u - v;
      return c * sortDir || a.i - b.i;
    };
    for (const r of [...rows].sort(cmp)) tbody.appendChild(trs.get(r.i));
    for (const th of headRow.cells) {
      th.textContent = th.textContent.replace(/ [\u25b2\u25bc]$/, "");
      if (th.dataset.key === key) th.textContent += sortDir > 0 ? " \u25b2" : " \u25bc";
    }
  }

  let selected = null;
  function select(i, fromChart) {
    for (const n of marks.get(selected) || []) n.classList.remove("sel");
    if (selected !== null) trs.get(selected).classList.remove("sel");
    selected = selected === i ? null : i;
    if (selected === null) return;
    for (const n of marks.get(i) || []) n.classList.add("sel");
    const tr = trs.get(i);
    tr.classList.add("sel");
    if (fromChart) tr.scrollIntoView({ block: "nearest" });
  }
})();
"""
