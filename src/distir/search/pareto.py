"""The memory/throughput Pareto front of searched strategies, and two pictures of it.

A *result* is one ranked strategy as the search reports it: a mapping with at least
``strategy`` (str), ``peak_memory_bytes`` (float, max over devices), ``throughput``
(samples/s) and ``fits`` (bool); the pictures also show, when present, ``d``, ``t``, ``p``,
``k``, ``step_time_s``, ``mfu``, ``capacity_bytes`` (smallest device memory among those
used), ``bubble_fraction`` and ``source`` (``"simulated"`` for exact figures, ``"screen"``
for analytic estimates; anything else is drawn as screen-only, since it is not known exact).

* :func:`pareto_front` — indices of the results no other result beats on both axes.
* :func:`write_png` — a static scatter (matplotlib, Agg canvas, no pyplot global state).
* :func:`write_html` — one self-contained page: inline SVG drawn by vanilla JS from JSON
  embedded in the page, hover tooltips, linked highlighting with a sortable table. No network.

Both writers replace ``path`` atomically and touch no other file.
"""

from __future__ import annotations

import contextlib
import html
import json
import math
import os
import re
import tempfile
from collections.abc import Mapping, Sequence
from io import BytesIO
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.text import Annotation

_HA = Literal["left", "center", "right"]
_VA = Literal["bottom", "center", "top"]

GIB = float(1 << 30)
PNG_DPI = 120
# Beyond this many front points the labels overlap whatever the layout; label a spread of them.
MAX_FRONT_LABELS = 24

FIT_COLOR = "#1f77b4"
OOM_COLOR = "#d62728"
FRONT_COLOR = "#404040"
BEST_COLOR = "#ffbf00"


# --- the front -----------------------------------------------------------------------------


def pareto_front(results: Sequence[Mapping[str, Any]]) -> list[int]:
    """Indices of the results not dominated in (lower ``peak_memory_bytes``, higher ``throughput``).

    Result ``j`` dominates ``i`` when it needs no more memory and delivers no less throughput,
    and is strictly better in at least one of the two. Of several results with exactly equal
    memory and throughput only the first (lowest index) is kept. Results whose memory or
    throughput is NaN are not comparable and are never on the front; infinities compare as
    ordinary numbers. Feasibility (``fits``) is ignored: this is the trade-off curve, the
    capacity line is drawn separately. The indices come sorted by peak memory ascending (which
    on a front is also throughput ascending). O(n log n).
    """
    keyed: list[tuple[float, float, int]] = []
    for i, r in enumerate(results):
        mem, thr = float(r["peak_memory_bytes"]), float(r["throughput"])
        if not (math.isnan(mem) or math.isnan(thr)):
            keyed.append((mem, -thr, i))
    # Sweep by memory ascending, best throughput first among equal memory, then by index: a
    # result is on the front iff it beats the throughput of everything swept before it (all of
    # which need no more memory); an exact tie sweeps after its first occurrence and is dropped.
    keyed.sort()
    front: list[int] = []
    best = -math.inf
    for _, neg_thr, i in keyed:
        thr = -neg_thr
        if not front or thr > best:
            front.append(i)
            best = thr
    return front


def best_fitting(results: Sequence[Mapping[str, Any]]) -> int | None:
    """Index of the highest-throughput result that fits in memory (the first on ties), or None
    when none does. Only finite throughputs count: an infinite or NaN one is a broken figure,
    not a winner (and could not be drawn)."""
    best: int | None = None
    best_thr = -math.inf
    for i, r in enumerate(results):
        thr = float(r["throughput"])
        if bool(r["fits"]) and math.isfinite(thr) and (best is None or thr > best_thr):
            best, best_thr = i, thr
    return best


def capacity_line(results: Sequence[Mapping[str, Any]]) -> tuple[float, bool] | None:
    """Where to draw the memory capacity, in bytes, and whether every result has that capacity.

    When all finite ``capacity_bytes`` agree that value is returned with True; otherwise the
    smallest with False (strategies placed on different devices see different limits). None
    when no result carries a finite capacity.
    """
    caps = [
        float(c) for r in results if (c := r.get("capacity_bytes")) is not None and math.isfinite(float(c))
    ]
    if not caps:
        return None
    lo = min(caps)
    return lo, all(c == lo for c in caps)


def _plottable(r: Mapping[str, Any]) -> bool:
    return math.isfinite(float(r["peak_memory_bytes"])) and math.isfinite(float(r["throughput"]))


def _labelled(front: Sequence[int], best: int | None) -> set[int]:
    """Which front points get a strategy label: all, or an even spread (ends and best included)."""
    if len(front) <= MAX_FRONT_LABELS:
        return set(front)
    n = len(front)
    picked = {front[round(k * (n - 1) / (MAX_FRONT_LABELS - 1))] for k in range(MAX_FRONT_LABELS)}
    if best is not None and best in front:
        picked.add(best)
    return picked


# --- writing -------------------------------------------------------------------------------


def _umask() -> int:
    # os.umask can only be read by setting it, which races with other threads creating files;
    # Linux publishes it in /proc. Elsewhere assume the common default.
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    return 0o022


def _write_atomically(path: Path, data: bytes) -> Path:
    """Replace ``path`` by ``data`` so that a reader sees the old file or the whole new one.

    The bytes go to a fresh, uniquely named temporary file in the same directory (so that
    ``os.replace`` is a rename on one filesystem), which is removed if anything fails. The new
    file keeps an existing file's permissions, else gets the usual ``0o666 & ~umask`` (mkstemp
    would leave it private). The parent directory must exist.
    """
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        try:
            mode = path.stat().st_mode & 0o7777
        except FileNotFoundError:
            mode = 0o666 & ~_umask()
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    return path


# --- PNG -----------------------------------------------------------------------------------


def _plain(s: str) -> str:
    """``s`` as literal matplotlib text: an unescaped pair of ``$`` would start mathtext (and an
    odd one can make the whole figure fail to render)."""
    return s.replace("$", r"\$")


def write_png(results: Sequence[Mapping[str, Any]], path: Path, title: str) -> Path:
    """Draw peak memory (GiB, x) against throughput (samples/s, y) and write it to ``path`` as PNG.

    Fitting results are filled blue, out-of-memory ones hollow red; circles are simulated,
    triangles screen-only. The Pareto front (:func:`pareto_front`) is a step line with its
    points labelled by strategy (a spread of them past ``MAX_FRONT_LABELS``); the capacity
    (:func:`capacity_line`) is a dashed vertical line; the best fitting result
    (:func:`best_fitting`) is a star. Results with non-finite memory or throughput cannot be
    placed and are counted in a note. No results gives a figure that says so. Uses a
    matplotlib ``Figure`` on an Agg canvas (no pyplot, no global backend switch); ``PNG_DPI``
    dots per inch. Writes ``path`` atomically (see module doc) and returns it.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(10.0, 6.5), dpi=PNG_DPI, layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    labels = _draw(ax, results, title)
    if labels:
        # Label boxes are only known once drawn: lay the figure out, freeze that layout so the
        # boxes stay where they were measured, then move (or drop) labels that collide.
        fig.draw_without_rendering()
        fig.set_layout_engine("none")
        _place_labels(ax, labels)
    buf = BytesIO()
    fig.savefig(buf, format="png", dpi=PNG_DPI)
    return _write_atomically(path, buf.getvalue())


def _draw(ax: Axes, results: Sequence[Mapping[str, Any]], title: str) -> list[Annotation]:
    """Draw the scatter on ``ax``; return the strategy labels of the front, best first."""
    ax.set_title(_plain(title), fontsize=12)
    ax.set_xlabel("peak memory per device (GiB)")
    ax.set_ylabel("throughput (samples/s)")
    shown = [i for i, r in enumerate(results) if _plottable(r)]
    if not shown:
        msg = "no results" if not results else f"no plottable results ({len(results)} non-finite)"
        ax.text(0.5, 0.5, msg, transform=ax.transAxes, ha="center", va="center", fontsize=16, color="0.4")
        ax.set_xticks([])
        ax.set_yticks([])
        return []

    def x(i: int) -> float:
        return float(results[i]["peak_memory_bytes"]) / GIB

    def y(i: int) -> float:
        return float(results[i]["throughput"])

    for fits in (True, False):
        for simulated in (True, False):
            group = [
                i
                for i in shown
                if bool(results[i]["fits"]) == fits and (results[i].get("source") == "simulated") == simulated
            ]
            if not group:
                continue
            label = (
                f"{'fits' if fits else 'out of memory'}, "
                f"{'simulated' if simulated else 'screen only'} ({len(group)})"
            )
            style: dict[str, Any] = (
                {"c": FIT_COLOR, "edgecolors": "white", "linewidths": 0.5, "alpha": 0.85}
                if fits
                else {"facecolors": "none", "edgecolors": OOM_COLOR, "linewidths": 1.2}
            )
            ax.scatter(
                [x(i) for i in group],
                [y(i) for i in group],
                s=40,
                marker="o" if simulated else "^",
                label=label,
                zorder=3,
                **style,
            )

    best = best_fitting(results)
    front = [i for i in pareto_front(results) if _plottable(results[i])]
    labels: list[Annotation] = []
    if front:
        fx, fy = [x(i) for i in front], [y(i) for i in front]
        # Past the last front point the best attainable throughput stays flat: carry the step on
        # to the right of the data so the staircase reads as "best throughput within memory x".
        right = max(x(i) for i in shown)
        if right > fx[-1]:
            fx, fy = [*fx, right], [*fy, fy[-1]]
        ax.step(fx, fy, where="post", color=FRONT_COLOR, linewidth=1.2, label="Pareto front", zorder=2)
        chosen = _labelled(front, best)
        for i in sorted(chosen, key=lambda i: (i != best, front.index(i))):
            ann = ax.annotate(
                _plain(str(results[i]["strategy"])),
                (x(i), y(i)),
                xytext=(-5, 5),
                textcoords="offset points",
                ha="right",
                va="bottom",
                fontsize=7,
                color="0.15",
                zorder=6,
                bbox={"boxstyle": "round,pad=0.15", "fc": "white", "ec": "none", "alpha": 0.7},
            )
            labels.append(ann)

    cap = capacity_line(results)
    if cap is not None:
        gib, uniform = cap[0] / GIB, cap[1]
        label = (
            f"device memory {gib:.3g} GiB" if uniform else f"smallest device memory {gib:.3g} GiB (varies)"
        )
        ax.axvline(gib, linestyle="--", color=OOM_COLOR, linewidth=1.0, alpha=0.8, label=label, zorder=1)

    if best is not None and _plottable(results[best]):
        label = f"best: {results[best]['strategy']} ({y(best):,.1f} samples/s)"
        ax.scatter(
            [x(best)],
            [y(best)],
            s=300,
            marker="*",
            c=BEST_COLOR,
            edgecolors="black",
            linewidths=0.8,
            label=_plain(label),
            zorder=5,
        )
    hidden = len(results) - len(shown)
    if hidden:
        note = f"{hidden} result{'s' if hidden > 1 else ''} with non-finite memory or throughput not shown"
        ax.text(0.01, 0.01, note, transform=ax.transAxes, ha="left", va="bottom", fontsize=7, color="0.4")

    ax.set_xlim(left=0.0)
    ax.grid(True, alpha=0.3)
    legend = ax.legend(loc="best", fontsize=8, framealpha=0.9)
    if best is None:
        # in the legend rather than loose in the axes, where it could sit on points or labels
        legend.set_title("nothing fits in memory")
        legend.get_title().set(color=OOM_COLOR, fontsize=9, fontweight="bold")
    return labels


# Where a front label may go, relative to its point (offset in points, alignment), best first:
# left and up-left are the empty side of a front (dominated points lie down-right of it).
_LABEL_SPOTS: tuple[tuple[float, float, _HA, _VA], ...] = (
    (-8, 0, "right", "center"),
    (-6, 6, "right", "bottom"),
    (0, 8, "center", "bottom"),
    (5, 5, "left", "bottom"),
    (-5, -5, "right", "top"),
    (7, 0, "left", "center"),
    (6, -6, "left", "top"),
    (0, -9, "center", "top"),
)


def _place_labels(ax: Axes, labels: Sequence[Annotation]) -> None:
    """Greedily give each label (in order, so earlier ones have priority) the first spot of
    ``_LABEL_SPOTS`` that stays inside the axes and overlaps neither an already placed label,
    nor a front point, nor the legend; a label with no such spot is removed, since a pile of
    overlapping text helps nobody (the HTML page names every point). Needs a drawn figure."""
    from matplotlib.transforms import Bbox

    inside = ax.get_window_extent()
    px = ax.figure.dpi / 72  # points to pixels
    taken: list[Bbox] = []
    for ann in labels:
        cx, cy = ax.transData.transform(ann.xy)
        r = 5 * px  # a marker's reach around its own point
        taken.append(Bbox.from_extents(cx - r, cy - r, cx + r, cy + r))
    legend = ax.get_legend()
    if legend is not None:
        taken.append(legend.get_window_extent())
    for ann in labels:
        for dx, dy, ha, va in _LABEL_SPOTS:
            ann.xyann = (dx, dy)
            ann.set_horizontalalignment(ha)
            ann.set_verticalalignment(va)
            box = ann.get_window_extent().padded(1.5 * px)
            if (
                inside.x0 <= box.x0
                and box.x1 <= inside.x1
                and inside.y0 <= box.y0
                and box.y1 <= inside.y1
                and not any(box.overlaps(t) for t in taken)
            ):
                taken.append(box)
                break
        else:
            ann.remove()


# --- HTML ----------------------------------------------------------------------------------


def _num(v: Any) -> float | None:
    """A JSON-safe number: None for missing, NaN and ±inf (JSON has no such numbers)."""
    if v is None:
        return None
    f = float(v)
    return f if math.isfinite(f) else None


def _int(v: Any) -> int | None:
    return None if v is None or (isinstance(v, float) and not math.isfinite(v)) else int(v)


def page_data(results: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The JSON-ready data :func:`write_html` embeds: one row per result, in order, with the
    result's figures (non-finite numbers as None) plus ``i`` (its index), ``front``, ``best`` and
    ``label`` (drawn with its strategy name) flags; and the capacity line, if any."""
    front = pareto_front(results)
    on_front = set(front)
    best = best_fitting(results)
    labelled = _labelled([i for i in front if _plottable(results[i])], best)
    rows = []
    for i, r in enumerate(results):
        src = r.get("source")
        rows.append(
            {
                "i": i,
                "strategy": str(r["strategy"]),
                **{k: _int(r.get(k)) for k in ("d", "t", "p", "k")},
                **{
                    k: _num(r.get(k))
                    for k in (
                        "step_time_s",
                        "throughput",
                        "mfu",
                        "peak_memory_bytes",
                        "capacity_bytes",
                        "bubble_fraction",
                    )
                },
                "fits": bool(r["fits"]),
                "source": None if src is None else str(src),
                "front": i in on_front,
                "best": i == best,
                "label": i in labelled,
            }
        )
    cap = capacity_line(results)
    return {"rows": rows, "capacity": None if cap is None else {"bytes": cap[0], "uniform": cap[1]}}


def script_json(obj: Any) -> str:
    """``obj`` as JSON that is inert inside an HTML ``<script>`` block.

    NaN and infinities raise (convert them first, see :func:`page_data`). Every ``<``, ``>``
    and ``&`` is written as a ``\\uXXXX`` escape, which JSON reads back as the same character:
    this covers ``</script`` (which would end the block) and ``<!--`` (which changes how the
    browser finds the end), not only ``</``; non-ASCII is escaped too (``ensure_ascii``).
    """
    text = json.dumps(obj, allow_nan=False, separators=(",", ":"))
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def write_html(results: Sequence[Mapping[str, Any]], path: Path, title: str) -> Path:
    """Write one self-contained interactive page of the results to ``path`` and return it.

    The page embeds :func:`page_data` as JSON in a ``<script type="application/json"
    id="distir-data">`` block (see :func:`script_json`) and draws from it, with inline vanilla
    JS and no network: the scatter of :func:`write_png` as SVG (hover a point for its strategy,
    step time, throughput, MFU, peak memory against capacity, bubble, fits and source), and a
    table of all results, sortable by clicking a header, front rows marked. Clicking a point or
    a row highlights both. Strategy names are only ever set as text, never parsed as HTML.
    No results gives a page that says so. Writes ``path`` atomically and returns it.
    """
    data = page_data(results)
    rows = data["rows"]
    n_fit = sum(r["fits"] for r in rows)
    n_front = sum(r["front"] for r in rows)
    best = next((r for r in rows if r["best"]), None)
    if not rows:
        summary = "no results"
    else:
        summary = (
            f"{len(rows)} strateg{'ies' if len(rows) != 1 else 'y'}, {n_fit} fit in memory, "
            f"{n_front} on the memory/throughput Pareto front. "
        )
        if best is None:
            summary += "Nothing fits in memory."
        else:
            summary += f"Best that fits: {best['strategy']} ({best['throughput']:,.1f} samples/s)."
    body = _BODY if rows else '<p class="empty">no results</p>'
    parts = {
        "TITLE": html.escape(title),
        "SUMMARY": html.escape(summary),
        "BODY": body,
        "CSS": _CSS,
        "JS": _JS,
        "DATA": script_json(data),
    }
    # One pass, so that text substituted in (a title, a strategy name) is never itself rescanned
    # for placeholders.
    page = re.sub(r"__([A-Z]+)__", lambda m: parts[m[1]], _PAGE)
    return _write_atomically(path, page.encode("utf-8"))


_PAGE = """<!DOCTYPE html>
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

_BODY = """<div id="chart-wrap">
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

_CSS = """
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

_JS = r"""
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
      ["MFU", pct(r.mfu)], ["peak memory", mem], ["bubble", pct(r.bubble_fraction)],
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
    ["mfu", "MFU", pct], ["peak_memory_bytes", "peak memory", gib], ["capacity_bytes", "capacity", gib],
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
