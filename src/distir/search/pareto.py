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

import html
import json
import math
import re
from collections.abc import Mapping, Sequence
from io import BytesIO
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from distir.files import write_atomically
from distir.search.pareto_page import BODY, CSS, JS, PAGE

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
    return write_atomically(path, buf.getvalue())


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
                        "hfu",
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
    body = BODY if rows else '<p class="empty">no results</p>'
    parts = {
        "TITLE": html.escape(title),
        "SUMMARY": html.escape(summary),
        "BODY": body,
        "CSS": CSS,
        "JS": JS,
        "DATA": script_json(data),
    }
    # One pass, so that text substituted in (a title, a strategy name) is never itself rescanned
    # for placeholders.
    page = re.sub(r"__([A-Z]+)__", lambda m: parts[m[1]], PAGE)
    return write_atomically(path, page.encode("utf-8"))
