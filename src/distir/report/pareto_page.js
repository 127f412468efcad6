(function () {
  "use strict";
  const data = JSON.parse(document.getElementById("distir-data").textContent);
  const rows = data.rows;
  const svg = document.getElementById("chart");
  if (!svg || rows.length === 0) return;
  const NS = "http://www.w3.org/2000/svg";
  const GIB = 1073741824;
  const W = 900, H = 520, M = { l: 80, r: 24, t: 18, b: 52 };
  const PW = W - M.l - M.r, PH = H - M.t - M.b;
  const MAX_LABELS = 24;

  const fin = (v) => typeof v === "number" && isFinite(v);
  const pct = (v) => (fin(v) ? (100 * v).toFixed(1) + "%" : "\u2014");
  const gib = (v) => (fin(v) ? (v / GIB).toFixed(2) + " GiB" : "\u2014");
  const num = (v, dp) =>
    fin(v) ? v.toLocaleString("en-US", { minimumFractionDigits: dp, maximumFractionDigits: dp }) : "\u2014";
  const secs = (v) => (!fin(v) ? "\u2014" : v < 1 ? (1000 * v).toFixed(2) + " ms" : v.toFixed(3) + " s");
  const int = (v) => (v === null || v === undefined ? "\u2014" : String(v));
  const src = (v) => (v === "simulated" ? "simulated" : v === "screen" ? "screen (analytic)" : v || "\u2014");
  const gibShort = (g) => (g >= 100 ? Math.round(g).toLocaleString("en-US") : String(+g.toPrecision(3)));
  const text = (v) => (v === null || v === undefined ? "\u2014" : String(v));

  function el(tag, attrs, parent) {
    const e = document.createElementNS(NS, tag);
    for (const k in attrs) e.setAttribute(k, attrs[k]);
    if (parent) parent.appendChild(e);
    return e;
  }

  // --- what can be drawn, and the views
  const placeable = (r) => fin(r.peak_memory_bytes) && r.peak_memory_bytes > 0 && fin(r.throughput);
  const shown = rows.filter(placeable);
  const mem = (r) => r.peak_memory_bytes / GIB;
  const cap = data.capacity;
  const capG = cap ? cap.bytes / GIB : null;
  const xsAll = shown.map(mem).concat(capG ? [capG] : []);
  const ys = shown.map((r) => r.throughput);
  let yLo = Math.min(...ys), yHi = Math.max(...ys);
  const pad = (yHi - yLo) * 0.08 || Math.abs(yHi) * 0.1 || 1;
  const yMin = Math.min(...ys) >= 0 ? Math.max(0, yLo - pad) : yLo - pad;
  yLo = yMin; yHi += pad;
  const allView = { x0: Math.min(...xsAll) / 1.25, x1: Math.max(...xsAll) * 1.25, y0: yLo, y1: yHi };
  const fitView = data.window
    ? { x0: data.window.lo / GIB, x1: data.window.hi / GIB, y0: yLo, y1: yHi }
    : { ...allView };
  let view = { ...fitView };
  let logx = true;

  // --- filters: one group per field with at least two values among the results
  const FILTERS = [
    ["schedule", "schedule", text], ["zero", "ZeRO stage", text], ["recompute", "recompute", text],
    ["fits", "memory", (v) => (v ? "fits" : "out of memory")], ["source", "source", src],
  ];
  const keyOf = (v) => JSON.stringify(v === undefined ? null : v);
  const allowed = new Map();
  const filterBox = document.getElementById("filters");
  for (const [field, title, show] of FILTERS) {
    const values = [...new Map(rows.map((r) => [keyOf(r[field]), r[field]])).entries()];
    if (values.length < 2) continue;
    values.sort((a, b) => (a[0] < b[0] ? -1 : a[0] > b[0] ? 1 : 0));
    const on = new Set(values.map(([k]) => k));
    allowed.set(field, on);
    const fs = document.createElement("fieldset");
    const lg = document.createElement("legend");
    lg.textContent = title;
    fs.appendChild(lg);
    for (const [k, v] of values) {
      const label = document.createElement("label");
      const box = document.createElement("input");
      box.type = "checkbox";
      box.checked = true;
      box.dataset.field = field;
      box.addEventListener("change", () => {
        if (box.checked) on.add(k); else on.delete(k);
        refilter();
      });
      label.appendChild(box);
      label.appendChild(document.createTextNode(" " + show(v) + " (" + rows.filter((r) => keyOf(r[field]) === k).length + ")"));
      fs.appendChild(label);
    }
    filterBox.appendChild(fs);
  }
  const visible = (r) => [...allowed].every(([field, on]) => on.has(keyOf(r[field])));

  // The memory/throughput front of the rows given (the rule of distir.search.pareto.pareto_front).
  function frontOf(rs) {
    const sorted = [...rs].sort((a, b) =>
      a.peak_memory_bytes - b.peak_memory_bytes || b.throughput - a.throughput || a.i - b.i);
    const out = [];
    let best = -Infinity;
    for (const r of sorted) if (!out.length || r.throughput > best) { out.push(r); best = r.throughput; }
    return out;
  }

  // --- scales
  const lg10 = Math.log10;
  const fx = (v) => (logx ? (lg10(v) - lg10(view.x0)) / (lg10(view.x1) - lg10(view.x0)) : (v - view.x0) / (view.x1 - view.x0));
  const sx = (v) => M.l + fx(v) * PW;
  const sy = (v) => H - M.b - ((v - view.y0) / (view.y1 - view.y0)) * PH;

  // "Nice" ticks: steps of 1, 2 or 5 times a power of ten, about n of them across [lo, hi].
  function ticks(lo, hi, n) {
    const raw = (hi - lo) / n;
    const p = Math.pow(10, Math.floor(Math.log10(raw)));
    const step = [1, 2, 5, 10].map((m) => m * p).find((s) => s >= raw) || 10 * p;
    const out = [];
    for (let v = Math.ceil(lo / step) * step; v <= hi + step * 1e-9; v += step) out.push(+v.toPrecision(12));
    return out;
  }
  function logTicks(lo, hi) {
    for (const subs of [[1], [1, 2, 5], [1, 2, 3, 4, 5, 6, 7, 8, 9]]) {
      const out = [];
      for (let e = Math.floor(lg10(lo)); e <= Math.ceil(lg10(hi)); e++) {
        for (const m of subs) {
          const v = +(m * Math.pow(10, e)).toPrecision(12);
          if (v >= lo && v <= hi) out.push(v);
        }
      }
      if (out.length >= 4 || subs.length === 9) return out.length >= 2 ? out : ticks(lo, hi, 6);
    }
    return ticks(lo, hi, 6);
  }

  // --- drawing
  const tip = document.getElementById("tip");
  const wrap = document.getElementById("chart-wrap");
  let marks = new Map(); // row index -> SVG elements standing for it
  let selected = null;

  function showTip(r, ev) {
    tip.replaceChildren();
    const b = document.createElement("b");
    b.textContent = r.strategy;
    tip.appendChild(b);
    const memText = gib(r.peak_memory_bytes) + (fin(r.capacity_bytes) ? " of " + gib(r.capacity_bytes) +
      " (" + pct(r.peak_memory_bytes / r.capacity_bytes) + ")" : "");
    const lines = [
      ["step time", secs(r.step_time_s)], ["throughput", num(r.throughput, 1) + " samples/s"],
      ["MFU", pct(r.mfu)], ["HFU", pct(r.hfu)], ["peak memory", memText], ["bubble", pct(r.bubble_fraction)],
      ["schedule", text(r.schedule)], ["ZeRO", text(r.zero)], ["recompute", text(r.recompute)],
      ["fits", r.fits ? "yes" : "no (out of memory)"], ["source", src(r.source)],
    ];
    if (r.front) lines.push(["", "on the Pareto front of all results"]);
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
    node.addEventListener("click", () => { if (!dragged) select(r.i, true); });
    if (!marks.has(r.i)) marks.set(r.i, []);
    marks.get(r.i).push(node);
    if (r.i === selected) node.classList.add("sel");
  }

  function axes(g) {
    const xt = logx ? logTicks(view.x0, view.x1) : ticks(view.x0, view.x1, 8);
    for (const t of xt) {
      el("line", { class: "grid", x1: sx(t), x2: sx(t), y1: M.t, y2: H - M.b }, g);
      el("text", { x: sx(t), y: H - M.b + 16, "text-anchor": "middle" }, g).textContent = +t.toPrecision(4);
    }
    for (const t of ticks(view.y0, view.y1, 6)) {
      el("line", { class: "grid", x1: M.l, x2: W - M.r, y1: sy(t), y2: sy(t) }, g);
      el("text", { x: M.l - 6, y: sy(t) + 4, "text-anchor": "end" }, g).textContent =
        t.toLocaleString("en-US", { maximumFractionDigits: 6 });
    }
    el("rect", { class: "frame", x: M.l, y: M.t, width: PW, height: PH }, g);
    el("text", { class: "axis-label", x: M.l + PW / 2, y: H - 12, "text-anchor": "middle" }, g)
      .textContent = "peak memory per device (GiB" + (logx ? ", log scale)" : ")");
    el("text", { class: "axis-label", transform: `translate(16 ${M.t + PH / 2}) rotate(-90)`,
      "text-anchor": "middle" }, g).textContent = "throughput (samples/s)";
  }

  function capacity(g) {
    if (!cap) return;
    const cx = sx(capG);
    if (cx > W - M.r) return;
    const left = Math.max(cx, M.l);
    el("rect", { class: "oom-zone", x: left, y: M.t, width: W - M.r - left, height: PH }, g);
    if (cx < M.l) return;
    el("line", { class: "cap-line", x1: cx, x2: cx, y1: M.t, y2: H - M.b }, g);
    el("text", { class: "cap-text", transform: `translate(${cx + 5} ${M.t + 6}) rotate(90)` }, g).textContent =
      (cap.uniform ? "device memory " : "smallest device memory ") + gibShort(capG) +
      " GiB" + (cap.uniform ? "" : " (varies)");
  }

  // Front labels: each (best first, then by memory) takes the first spot around its point that
  // stays in the plot and overlaps no label placed before and no front point; else none.
  const SPOTS = [[-8, 4, "end"], [-6, -7, "end"], [0, -10, "middle"], [6, -7, "start"], [-6, 15, "end"],
    [8, 4, "start"], [6, 15, "start"], [0, 18, "middle"], [-8, -18, "end"], [-8, 24, "end"]];
  function labels(g, front) {
    const inView = (r) => mem(r) >= view.x0 && mem(r) <= view.x1 && r.throughput >= view.y0 && r.throughput <= view.y1;
    let cand = front.filter(inView);
    if (cand.length > MAX_LABELS) {
      const n = cand.length;
      const keep = new Set();
      for (let k = 0; k < MAX_LABELS; k++) keep.add(cand[Math.round((k * (n - 1)) / (MAX_LABELS - 1))]);
      cand = cand.filter((r) => keep.has(r) || r.best);
    }
    cand.sort((a, b) => b.best - a.best);
    const taken = front.filter(inView).map((r) => {
      const x = sx(mem(r)), y = sy(r.throughput);
      return { x0: x - 6, y0: y - 6, x1: x + 6, y1: y + 6 };
    });
    const hit = (a, b) => a.x0 < b.x1 && b.x0 < a.x1 && a.y0 < b.y1 && b.y0 < a.y1;
    for (const r of cand) {
      const px = sx(mem(r)), py = sy(r.throughput);
      const t = el("text", { class: "flabel" }, g);
      t.textContent = r.strategy;
      let placed = false;
      for (const [dx, dy, anchor] of SPOTS) {
        t.setAttribute("x", px + dx);
        t.setAttribute("y", py + dy);
        t.setAttribute("text-anchor", anchor);
        const bb = t.getBBox();
        const box = { x0: bb.x - 2, y0: bb.y - 1, x1: bb.x + bb.width + 2, y1: bb.y + bb.height + 1 };
        if (box.x0 >= M.l && box.x1 <= W - M.r && box.y0 >= M.t && box.y1 <= H - M.b && !taken.some((o) => hit(box, o))) {
          taken.push(box);
          placed = true;
          break;
        }
      }
      if (!placed) t.remove();
    }
  }

  function points(g, vis) {
    // Out-of-memory (hollow) points first, so filled fitting points are not hidden under them.
    let beyond = 0;
    for (const r of [...vis].sort((a, b) => a.fits - b.fits)) {
      const cls = "pt " + (r.fits ? "fit" : "oom");
      let x = sx(mem(r));
      const y = sy(r.throughput);
      let node;
      if (mem(r) > view.x1 && r.throughput >= view.y0 && r.throughput <= view.y1) {
        beyond++;
        x = W - M.r;
        node = el("path", { d: `M${x - 5} ${y - 5} L${x + 5} ${y} L${x - 5} ${y + 5} Z`, class: cls }, g);
      } else if (r.source === "simulated") {
        node = el("circle", { cx: x, cy: y, r: 5, class: cls }, g);
      } else {
        node = el("path", { d: `M${x} ${y - 6} L${x + 5.5} ${y + 4} L${x - 5.5} ${y + 4} Z`, class: cls }, g);
      }
      hook(node, r);
    }
    const best = vis.find((r) => r.best);
    if (best && mem(best) <= view.x1) {
      const cx = sx(mem(best)), cy = sy(best.throughput);
      const star = [];
      for (let k = 0; k < 10; k++) {
        const a = -Math.PI / 2 + (k * Math.PI) / 5, rad = k % 2 ? 4.2 : 10;
        star.push((cx + rad * Math.cos(a)).toFixed(2) + "," + (cy + rad * Math.sin(a)).toFixed(2));
      }
      hook(el("polygon", { points: star.join(" "), class: "pt best" }, g), best);
    }
    return beyond;
  }

  function draw() {
    svg.replaceChildren();
    marks = new Map();
    const defs = el("defs", {}, svg);
    const clip = el("clipPath", { id: "plot-area" }, defs);
    el("rect", { x: M.l, y: M.t - 12, width: PW + 12, height: PH + 24 }, clip);
    const vis = shown.filter(visible);
    axes(el("g", {}, svg));
    const plot = el("g", { "clip-path": "url(#plot-area)" }, svg);
    capacity(plot);
    const front = frontOf(vis);
    if (front.length) {
      // Step "post": from each front point the best attainable throughput holds until the next.
      let d = `M${sx(mem(front[0]))} ${sy(front[0].throughput)}`;
      for (const r of front.slice(1)) d += ` H${sx(mem(r))} V${sy(r.throughput)}`;
      d += ` H${W - M.r}`;
      el("path", { class: "front-line", d: d }, plot);
    }
    const beyond = points(plot, vis);
    labels(el("g", {}, svg), front);
    if (beyond) {
      el("text", { class: "note", x: W - M.r - 6, y: H - M.b - 6, "text-anchor": "end" }, svg).textContent =
        `${beyond} result${beyond > 1 ? "s" : ""} need more memory than ${gibShort(view.x1)} GiB: \u25b6 at the right edge`;
    }
    if (!shown.length) {
      el("text", { x: W / 2, y: H / 2, "text-anchor": "middle", class: "axis-label" }, svg).textContent =
        "no plottable results (non-finite memory or throughput)";
    }
    const hidden = rows.length - rows.filter(visible).length;
    document.getElementById("shown").textContent =
      `showing ${rows.length - hidden} of ${rows.length}` + (hidden ? ` (${hidden} filtered out)` : "");
  }

  // --- zoom and pan
  function toPlot(ev) {
    const box = svg.getBoundingClientRect();
    return { x: ((ev.clientX - box.left) * W) / box.width, y: ((ev.clientY - box.top) * H) / box.height };
  }
  function zoom(fxc, fyc, kx, ky) {
    if (kx !== 1) {
      if (logx) {
        const a = lg10(view.x0), b = lg10(view.x1), c = a + fxc * (b - a);
        view.x0 = Math.pow(10, c - (c - a) * kx);
        view.x1 = Math.pow(10, c + (b - c) * kx);
      } else {
        const c = view.x0 + fxc * (view.x1 - view.x0);
        view.x0 = c - (c - view.x0) * kx;
        view.x1 = c + (view.x1 - c) * kx;
      }
    }
    if (ky !== 1) {
      const c = view.y0 + fyc * (view.y1 - view.y0);
      view.y0 = c - (c - view.y0) * ky;
      view.y1 = c + (view.y1 - c) * ky;
    }
  }
  svg.addEventListener("wheel", (ev) => {
    ev.preventDefault();
    const p = toPlot(ev);
    const k = Math.exp(Math.max(-1, Math.min(1, ev.deltaY * 0.002)));
    zoom((p.x - M.l) / PW, (H - M.b - p.y) / PH, ev.altKey ? 1 : k, ev.shiftKey ? 1 : k);
    draw();
  }, { passive: false });
  let drag = null, dragged = false;
  svg.addEventListener("pointerdown", (ev) => {
    drag = { p: toPlot(ev), view: { ...view } };
    dragged = false;
  });
  svg.addEventListener("pointermove", (ev) => {
    if (!drag) return;
    const p = toPlot(ev);
    const dx = (p.x - drag.p.x) / PW, dy = (p.y - drag.p.y) / PH;
    if (!dragged && Math.hypot(p.x - drag.p.x, p.y - drag.p.y) < 4) return;
    if (!dragged) { dragged = true; svg.setPointerCapture(ev.pointerId); svg.classList.add("dragging"); }
    const v = drag.view;
    if (logx) {
      const s = dx * (lg10(v.x1) - lg10(v.x0));
      view.x0 = v.x0 / Math.pow(10, s);
      view.x1 = v.x1 / Math.pow(10, s);
    } else {
      const s = dx * (v.x1 - v.x0);
      view.x0 = v.x0 - s;
      view.x1 = v.x1 - s;
    }
    const s = dy * (v.y1 - v.y0);
    view.y0 = v.y0 + s;
    view.y1 = v.y1 + s;
    tip.hidden = true;
    draw();
  });
  const endDrag = () => { drag = null; svg.classList.remove("dragging"); setTimeout(() => { dragged = false; }, 0); };
  svg.addEventListener("pointerup", endDrag);
  svg.addEventListener("pointercancel", endDrag);
  svg.addEventListener("dblclick", () => { view = { ...fitView }; draw(); });
  document.getElementById("reset").addEventListener("click", () => { view = { ...fitView }; draw(); });
  document.getElementById("all").addEventListener("click", () => { view = { ...allView }; draw(); });
  document.getElementById("logx").addEventListener("change", (ev) => {
    logx = ev.target.checked;
    if (logx && !(view.x0 > 0)) view.x0 = Math.min(allView.x0, view.x1 / 10); // a log axis starts above 0
    draw();
  });

  // --- table
  const cols = [
    ["i", "#", int], ["strategy", "strategy", String], ["d", "D", int], ["t", "T", int], ["p", "P", int],
    ["k", "K", int], ["schedule", "schedule", text], ["zero", "ZeRO", int], ["recompute", "recompute", text],
    ["step_time_s", "step time", secs], ["throughput", "samples/s", (v) => num(v, 1)],
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

  function refilter() {
    for (const r of rows) trs.get(r.i).hidden = !visible(r);
    draw();
  }
  draw();
})();
