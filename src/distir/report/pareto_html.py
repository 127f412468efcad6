"""The interactive Pareto page of a search: one self-contained HTML file, no network.

The page is the template ``pareto_page.html`` (package data, with ``pareto_page.css``,
``pareto_page.js`` and, when there are results, ``pareto_body.html``) with the results embedded
as JSON in a ``<script type="application/json" id="distir-data">`` block (:func:`page_data`,
written by :func:`script_json`). Its script draws the plot of ``distir.report.pareto_png`` as SVG
— memory on a log scale in the window of ``pareto_axes.memory_window`` — with hover details,
zoom (wheel) and pan (drag), filters (schedule, ZeRO stage, recomputation, fits or not, source)
that apply to the plot and to a sortable table of all results, and front labels placed so
that they never overlap (a label with no free spot is left out; hovering names every point).
Strategy names are only ever set as text, never parsed as HTML.

Placeholders ``__NAME__`` in the template are filled in one pass, so text substituted in (a
title, a strategy name) is never itself rescanned for placeholders.
"""

from __future__ import annotations

import html
import json
import math
import re
from collections.abc import Mapping, Sequence
from importlib import resources
from pathlib import Path
from typing import Any

from distir.files import write_atomically
from distir.report.pareto_axes import FIT_SHARE, labelled, memory_window, on_log_axis
from distir.search.pareto import best_fitting, capacity_line, pareto_front

NUMBERS = (
    "step_time_s",
    "throughput",
    "mfu",
    "hfu",
    "peak_memory_bytes",
    "capacity_bytes",
    "bubble_fraction",
)


def _num(v: Any) -> float | None:
    """A JSON-safe number: None for missing, NaN and ±inf (JSON has no such numbers)."""
    if v is None:
        return None
    f = float(v)
    return f if math.isfinite(f) else None


def _int(v: Any) -> int | None:
    return None if v is None or (isinstance(v, float) and not math.isfinite(v)) else int(v)


def _text(v: Any) -> str | None:
    return None if v is None else str(v)


def page_data(results: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The JSON-ready data the page embeds: one row per result, in order, with the result's
    figures (non-finite numbers as None), its ``schedule``, ``zero`` and ``recompute`` when
    known, plus ``i`` (its index), ``front``, ``best`` and ``label`` (drawn with its strategy
    name) flags; the capacity line, if any; and the memory ``window`` (bytes, the default view)."""
    front = pareto_front(results)
    on_front = set(front)
    best = best_fitting(results)
    named = labelled([i for i in front if on_log_axis(results[i])], best)
    rows = []
    for i, r in enumerate(results):
        rows.append(
            {
                "i": i,
                "strategy": str(r["strategy"]),
                **{k: _int(r.get(k)) for k in ("d", "t", "p", "k", "zero")},
                **{k: _num(r.get(k)) for k in NUMBERS},
                "schedule": _text(r.get("schedule")),
                "recompute": _text(r.get("recompute")),
                "fits": bool(r["fits"]),
                "source": _text(r.get("source")),
                "front": i in on_front,
                "best": i == best,
                "label": i in named,
            }
        )
    cap = capacity_line(results)
    w = memory_window(results)
    return {
        "rows": rows,
        "capacity": None if cap is None else {"bytes": cap[0], "uniform": cap[1]},
        "window": None if w is None else {"lo": w.lo, "hi": w.hi, "fit_share": FIT_SHARE},
    }


def script_json(obj: Any) -> str:
    """``obj`` as JSON that is inert inside an HTML ``<script>`` block.

    NaN and infinities raise (convert them first, see :func:`page_data`). Every ``<``, ``>``
    and ``&`` is written as a ``\\uXXXX`` escape, which JSON reads back as the same character:
    this covers ``</script`` (which would end the block) and ``<!--`` (which changes how the
    browser finds the end), not only ``</``; non-ASCII is escaped too (``ensure_ascii``).
    """
    text = json.dumps(obj, allow_nan=False, separators=(",", ":"))
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def template(name: str) -> str:
    """A page file shipped as package data next to this module."""
    return resources.files("distir.report").joinpath(name).read_text(encoding="utf-8")


def _summary(rows: list[dict[str, Any]]) -> str:
    if not rows:
        return "no results"
    n_fit = sum(r["fits"] for r in rows)
    n_front = sum(r["front"] for r in rows)
    text = (
        f"{len(rows)} strateg{'ies' if len(rows) != 1 else 'y'}, {n_fit} fit in memory, "
        f"{n_front} on the memory/throughput Pareto front. "
    )
    best = next((r for r in rows if r["best"]), None)
    if best is None:
        return text + "Nothing fits in memory."
    return text + f"Best that fits: {best['strategy']} ({best['throughput']:,.1f} samples/s)."


def write_html(results: Sequence[Mapping[str, Any]], path: Path, title: str) -> Path:
    """Write the page (module docstring) of ``results`` to ``path`` atomically; return ``path``.
    No results gives a page that says so."""
    data = page_data(results)
    rows = data["rows"]
    parts = {
        "TITLE": html.escape(title),
        "SUMMARY": html.escape(_summary(rows)),
        "BODY": template("pareto_body.html") if rows else '<p class="empty">no results</p>',
        "CSS": template("pareto_page.css"),
        "JS": template("pareto_page.js"),
        "DATA": script_json(data),
    }
    page = re.sub(r"__([A-Z]+)__", lambda m: parts[m[1]], template("pareto_page.html"))
    return write_atomically(path, page.encode("utf-8"))


__all__ = ["page_data", "script_json", "write_html"]
