"""The Pareto plot of a search as a PNG (matplotlib, Agg canvas, no pyplot global state).

Peak memory per device (GiB, x, log scale framed by ``pareto_axes.memory_window``) against
throughput (samples/s, y). Fitting results are filled blue, out-of-memory ones hollow red;
circles are simulated, triangles screen-only (``source``: ``"simulated"`` for exact figures,
anything else is drawn as screen-only, since it is not known exact). The Pareto front
(``distir.search.pareto.pareto_front``) is a step line with its points labelled by strategy (a
spread of them past ``MAX_FRONT_LABELS``) where a label fits without covering another label, a
front point or the legend; the capacity is a dashed vertical line with the out-of-memory side
shaded; the best fitting result is a star. Results beyond the window's right end are drawn as
arrows at that end and counted in a note; results that cannot be placed (non-finite figures,
no memory) are counted in a note. The legend sits below the axes, off the points.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from io import BytesIO
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from distir.files import write_atomically
from distir.report.pareto_axes import MemoryWindow, labelled, memory_window, on_log_axis
from distir.search.pareto import GIB, best_fitting, capacity_line, pareto_front

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure
    from matplotlib.text import Annotation

_HA = Literal["left", "center", "right"]
_VA = Literal["bottom", "center", "top"]

PNG_DPI = 120
FIT_COLOR = "#1f77b4"
OOM_COLOR = "#d62728"
FRONT_COLOR = "#404040"
BEST_COLOR = "#ffbf00"


def _plain(s: str) -> str:
    """``s`` as literal matplotlib text: an unescaped pair of ``$`` would start mathtext (and an
    odd one can make the whole figure fail to render)."""
    return s.replace("$", r"\$")


def pareto_figure(results: Sequence[Mapping[str, Any]], title: str) -> Figure:
    """The plot (module docstring) as a drawn matplotlib ``Figure`` on an Agg canvas."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(10.0, 7.0), dpi=PNG_DPI, layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    labels = _draw(ax, results, title)
    # Label boxes are only known once drawn: lay the figure out, freeze that layout so the
    # boxes stay where they were measured, then move (or drop) labels that collide.
    fig.draw_without_rendering()
    if labels:
        fig.set_layout_engine("none")
        _place_labels(ax, labels)
    return fig


def write_png(results: Sequence[Mapping[str, Any]], path: Path, title: str) -> Path:
    """Write :func:`pareto_figure` to ``path`` as PNG (``PNG_DPI``), atomically; return ``path``."""
    buf = BytesIO()
    pareto_figure(results, title).savefig(buf, format="png", dpi=PNG_DPI)
    return write_atomically(path, buf.getvalue())


def _empty(ax: Axes, results: Sequence[Mapping[str, Any]]) -> None:
    msg = "no results" if not results else f"no plottable results ({len(results)} without finite figures)"
    ax.text(0.5, 0.5, msg, transform=ax.transAxes, ha="center", va="center", fontsize=16, color="0.4")
    ax.set_xticks([])
    ax.set_yticks([])


def _draw(ax: Axes, results: Sequence[Mapping[str, Any]], title: str) -> list[Annotation]:
    """Draw the plot on ``ax``; return the strategy labels of the front, best first."""
    ax.set_title(_plain(title), fontsize=12)
    ax.set_xlabel("peak memory per device (GiB, log scale)")
    ax.set_ylabel("throughput (samples/s)")
    w = memory_window(results)
    shown = [i for i, r in enumerate(results) if on_log_axis(r)]
    if w is None:
        _empty(ax, results)
        return []
    _memory_axis(ax, w)

    def x(i: int) -> float:
        return min(float(results[i]["peak_memory_bytes"]), w.hi) / GIB

    def y(i: int) -> float:
        return float(results[i]["throughput"])

    _scatter(ax, results, shown, x, y, w)
    best = best_fitting(results)
    front = [i for i in pareto_front(results) if on_log_axis(results[i])]
    labels: list[Annotation] = []
    if front:
        fx, fy = [x(i) for i in front], [y(i) for i in front]
        # Past the last front point the best attainable throughput stays flat: carry the step on
        # to the right end so the staircase reads as "best throughput within memory x".
        fx, fy = [*fx, w.hi / GIB], [*fy, fy[-1]]
        ax.step(fx, fy, where="post", color=FRONT_COLOR, linewidth=1.2, label="Pareto front", zorder=2)
        for i in sorted(labelled(front, best), key=lambda i: (i != best, front.index(i))):
            ann = ax.annotate(
                _plain(str(results[i]["strategy"])),
                (x(i), y(i)),
                xytext=(-8, 0),
                textcoords="offset points",
                ha="right",
                va="center",
                fontsize=7,
                color="0.15",
                zorder=6,
                bbox={"boxstyle": "round,pad=0.15", "fc": "white", "ec": "none", "alpha": 0.75},
            )
            labels.append(ann)
    _capacity(ax, results, w)
    if best is not None and on_log_axis(results[best]):
        label = f"best: {results[best]['strategy']} ({y(best):,.1f} samples/s)"
        ax.scatter([x(best)], [y(best)], s=300, marker="*", c=BEST_COLOR, edgecolors="black",
                   linewidths=0.8, label=_plain(label), zorder=5)  # fmt: skip
    _notes(ax, results, shown, w)
    ax.grid(True, which="major", alpha=0.3)
    legend = fig_legend(ax)
    if best is None:
        legend.set_title("nothing fits in memory")
        legend.get_title().set(color=OOM_COLOR, fontsize=9, fontweight="bold")
    return labels


def _memory_axis(ax: Axes, w: MemoryWindow) -> None:
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    ax.set_xscale("log")
    ax.set_xlim(w.lo / GIB, w.hi / GIB)
    ax.xaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.xaxis.set_minor_formatter(NullFormatter())


def _scatter(ax: Axes, results: Sequence[Mapping[str, Any]], shown: list[int], x: Any, y: Any,
             w: MemoryWindow) -> None:  # fmt: skip
    """The results, by fits and source; those beyond the window as arrows at its right end."""
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
            inside = [i for i in group if float(results[i]["peak_memory_bytes"]) <= w.hi]
            outside = [i for i in group if i not in set(inside)]
            ax.scatter([x(i) for i in inside], [y(i) for i in inside], s=40,
                       marker="o" if simulated else "^", label=label, zorder=3, **style)  # fmt: skip
            if outside:
                ax.scatter([x(i) for i in outside], [y(i) for i in outside], s=50, marker=">",
                           zorder=3, clip_on=False, **style)  # fmt: skip


def _capacity(ax: Axes, results: Sequence[Mapping[str, Any]], w: MemoryWindow) -> None:
    cap = capacity_line(results)
    if cap is None:
        return
    gib, uniform = cap[0] / GIB, cap[1]
    size = _gib(cap[0])
    label = f"device memory {size} GiB" if uniform else f"smallest device memory {size} GiB (varies)"
    ax.axvline(gib, linestyle="--", color=OOM_COLOR, linewidth=1.2, alpha=0.9, label=label, zorder=1)
    if w.hi / GIB > gib:
        ax.axvspan(gib, w.hi / GIB, color=OOM_COLOR, alpha=0.05, zorder=0, linewidth=0)


def _gib(b: float) -> str:
    """Bytes as GiB in three significant figures, whole GiB with thousands separators past 100."""
    g = b / GIB
    return f"{g:,.0f}" if g >= 100 else f"{g:.3g}"


def _notes(ax: Axes, results: Sequence[Mapping[str, Any]], shown: list[int], w: MemoryWindow) -> None:
    notes = []
    if w.beyond:
        notes.append(
            f"{w.beyond} result{'s' if w.beyond > 1 else ''} need more than {_gib(w.hi)} GiB "
            f"(up to {_gib(w.most)} GiB): drawn as \u25b6 at the right edge"
        )
    hidden = len(results) - len(shown)
    if hidden:
        notes.append(f"{hidden} result{'s' if hidden > 1 else ''} without finite figures not shown")
    if notes:
        ax.text(0.995, 0.01, "\n".join(notes), transform=ax.transAxes, ha="right", va="bottom",
                fontsize=7, color="0.35", zorder=7)  # fmt: skip


def fig_legend(ax: Axes) -> Any:
    """The legend below the axes, in columns, so that it never covers a point or a label."""
    handles, texts = ax.get_legend_handles_labels()
    fig = ax.get_figure()
    assert fig is not None
    return fig.legend(handles, texts, loc="outside lower center", ncols=3, fontsize=8, frameon=False)


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
    (-8, 12, "right", "bottom"),
    (-8, -12, "right", "top"),
)


def _place_labels(ax: Axes, labels: Sequence[Annotation]) -> None:
    """Greedily give each label (in order, so earlier ones have priority) the first spot of
    ``_LABEL_SPOTS`` that stays inside the axes and overlaps neither an already placed label nor
    a front point; a label with no such spot is removed, since a pile of overlapping text helps
    nobody (the HTML page names every point). Needs a drawn figure."""
    from matplotlib.transforms import Bbox

    inside = ax.get_window_extent()
    fig = ax.get_figure()
    assert fig is not None
    px = fig.dpi / 72  # points to pixels
    taken: list[Bbox] = []
    for ann in labels:
        cx, cy = ax.transData.transform(ann.xy)
        r = 5 * px  # a marker's reach around its own point
        taken.append(Bbox.from_extents(cx - r, cy - r, cx + r, cy + r))
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


__all__ = ["PNG_DPI", "pareto_figure", "write_png"]
