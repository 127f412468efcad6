"""What ``distir search`` shows: the ranked table, JSON, CSV and the ``--explain`` comparison."""

from __future__ import annotations

import csv
import io
import math
from pathlib import Path
from typing import Any

from rich.table import Table

from distir.files import write_atomically
from distir.parallel.strategy import StrategyError, parse_strategy
from distir.report.fields import SCHEMA, STRATEGY_FIELDS, chunk_blocks, strategy_fields
from distir.report.numerics import slow_half_warnings
from distir.search.run import SearchOutput, build_space, is_pure
from distir.sim.summary import format_seconds

GIB = float(1 << 30)
CSV_KEYS = (
    "rank",
    *STRATEGY_FIELDS,
    "dtype",
    "precision",
    "step_time_s",
    "throughput",
    "mfu",
    "hfu",
    "peak_memory_bytes",
    "capacity_bytes",
    "fits",
    "bubble_fraction",
    "compute_s",
    "comm_s",
    "screen_step_time_s",
)


def _pct(x: float | None) -> str:
    return "–" if x is None or not math.isfinite(x) else f"{100 * x:.1f}%"


def _finite(x: Any) -> Any:
    return None if isinstance(x, float) and not math.isfinite(x) else x


def with_fields(model: str, batch: int, row: dict[str, Any]) -> dict[str, Any]:
    """``row`` (a result or an estimate) led by every part of its strategy as its own field
    (``distir.report.fields``; ``layers_per_chunk`` null where the strategy does not fit the model)."""
    s = parse_strategy(row["strategy"])
    try:
        blocks: tuple[int, ...] | None = chunk_blocks(model, s)
    except StrategyError:
        blocks = None
    return {**strategy_fields(s, batch, blocks), **row}


def search_json(o: SearchOutput) -> dict[str, Any]:
    """The ``--json`` object (``docs/json.md``, versioned by ``schema``): ``results`` best first
    (each with every part of its strategy as a field, ``step_time_s``, ``throughput``,
    ``peak_memory_bytes``, ``fits`` and more), the screen's counts and timings."""
    r = o.request
    return {
        "schema": SCHEMA,
        "model": r.model,
        "cluster": r.cluster if isinstance(r.cluster, str) else r.cluster.name,
        "devices": o.cluster.num_devices,
        "batch": r.batch,
        "mode": "train" if r.train else "infer",
        "optimizer": r.optimizer,
        "dtype": r.dtype,
        "precision": r.precision,
        "tp_comm_overlap": r.tp_comm_overlap,
        "trainer": r.trainer,
        "warnings": slow_half_warnings(r.dtype, o.cluster),
        "results": [
            {k: _finite(v) for k, v in with_fields(r.model, r.batch, row).items()} for row in o.results
        ],
        "screened": o.n_screened,
        "simulated": len(o.results),
        "cached": o.n_cached,
        "from_store": o.from_store,  # re-rendered from a finished search: timings are its
        "layer_profiles": o.profiles,
        "advice": o.advice,  # when nothing fits: the smallest changes that would
        "timings_s": {k: round(v, 4) for k, v in o.timings.items()},
        "screen_top": [
            with_fields(
                r.model,
                r.batch,
                {
                    "strategy": str(e.strategy),
                    "step_time_s": e.step_time_s,
                    "peak_memory_bytes": e.peak_memory_bytes,
                    "fits": e.fits,
                },
            )
            for e in o.screened[:20]
        ],
    }


def plot_rows(o: SearchOutput) -> list[dict[str, Any]]:
    """The simulated results and every other screened strategy (marked ``source: screen``)."""
    rows = [r for r in o.results if "error" not in r]
    seen = {r["strategy"] for r in rows}
    batch = o.request.batch
    for e in o.screened:
        s = e.strategy
        if str(s) in seen:
            continue
        rows.append(
            {
                "strategy": str(s),
                "d": s.d,
                "t": s.t,
                "p": s.p,
                "k": s.k,
                "schedule": s.schedule,
                "zero": s.zero,
                "recompute": s.recompute,
                "microbatch_size": batch // (s.d * s.k),
                "step_time_s": e.step_time_s,
                "throughput": e.throughput(batch),
                "peak_memory_bytes": e.peak_memory_bytes,
                "capacity_bytes": e.capacity_bytes,
                "fits": e.fits,
                "bubble_fraction": e.bubble_fraction,
                "source": "screen",
            }
        )
    return rows


def _csv_cell(v: Any) -> Any:
    """Lists (layers per chunk, placement, shares) as the strategy string writes them: 15-17."""
    return "-".join(map(str, v)) if isinstance(v, list | tuple) else v


def write_csv(o: SearchOutput, path: Path) -> None:
    """The ranked results, one row each, the columns ``CSV_KEYS`` (``docs/json.md``)."""
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=CSV_KEYS, extrasaction="ignore", lineterminator="\n")
    w.writeheader()
    r = o.request
    for i, row in enumerate(o.results, 1):
        w.writerow({"rank": i, **{k: _csv_cell(v) for k, v in with_fields(r.model, r.batch, row).items()}})
    write_atomically(path, buf.getvalue())


def _t(s: float) -> str:
    return format_seconds(s) if math.isfinite(s) else "—"


def results_table(o: SearchOutput) -> Table:
    r = o.request
    title = (
        f"{r.model} on {o.cluster.describe()}, batch {r.batch}, {'training' if r.train else 'inference'} "
        f"in {r.dtype}{' (mixed: fp32 masters)' if r.precision == 'mixed' and r.train else ''}"
        f"{', TP communication overlapped' if r.tp_comm_overlap else ''}"
        f"{', as ' + r.trainer + ' runs it' if r.trainer != 'distir' else ''}: "
        f"{o.n_screened} strategies screened, {len(o.results)} simulated"
    )
    table = Table(
        title=title,
        caption="ranked by simulated throughput; MFU: model FLOPs (recomputation excluded), HFU: all "
        "FLOPs executed; memory: the worst device's peak / its capacity (GiB); "
        "screen: the analytic estimate of the step; mb×k: samples per GPU and microbatch × "
        "microbatches (gradient-accumulation steps) per step",
    )
    for h in ("#", "strategy", "mb×k", "step", "samples/s", "MFU", "HFU", "memory", "bubble", "screen"):
        if h == "strategy":  # long partitions fold; the figures never do
            table.add_column(h, overflow="fold", ratio=1)
        else:
            table.add_column(h, justify="right", no_wrap=True)
    for i, row in enumerate(o.results, 1):
        if "error" in row:
            table.add_row(
                str(i), row["strategy"], "", "[red]error[/red]", "", "", "", row["error"][:60], "", ""
            )
            continue
        mem = f"{row['peak_memory_bytes'] / GIB:.1f}/{row['capacity_bytes'] / GIB:.0f}G"
        if not row["fits"]:
            mem = f"[red]{mem} OOM[/red]"
        table.add_row(
            str(i),
            row["strategy"],
            f"{row['microbatch_size']}×{row['k']}",
            _t(row["step_time_s"]),
            f"{row['throughput']:.1f}",
            _pct(row.get("mfu")),
            _pct(row.get("hfu")),
            mem,
            f"{100 * row['bubble_fraction']:.0f}%",
            _t(row.get("screen_step_time_s", math.nan)),
        )
    return table


def _pure(rows: list[dict[str, Any]], kind: str) -> dict[str, Any] | None:
    cands = [
        r
        for r in rows
        if "error" not in r and r.get("c", 1) == 1 and is_pure(r["d"], r["t"], r["p"], kind.lower())
    ]
    return next((r for r in cands if r["fits"]), cands[0] if cands else None)


def _why_not_pure(o: SearchOutput, kind: str) -> str:
    n = o.cluster.num_devices
    d, t, p = {"D": (n, 1, 1), "T": (1, n, 1), "P": (1, 1, n)}[kind]
    why = build_space(o.request, o.cluster).why_not(d, t, p)
    # in the space but not simulated: the search was cut short, or its results predate --explain
    return why or "no such strategy was simulated"


def explain(o: SearchOutput) -> list[str]:
    """Why the winner beats the best pure-D, pure-T and pure-P strategies, in lines of text:
    per strategy compute, communication, idle (bubble) time and peak memory, then how much slower
    (or faster, yet out of memory) each is and what makes most of the difference."""
    best = o.best()
    if best is None or "error" in best:
        return ["no strategy was simulated successfully; nothing to explain"]
    lines = [f"winner {best['strategy']}: {_breakdown(best)}"]
    for kind, name in (("D", "data"), ("T", "tensor"), ("P", "pipeline")):
        other = _pure(o.results, kind)
        if other is None:
            lines.append(f"pure {name} parallel: not searched: {_why_not_pure(o, kind)}")
            continue
        if other["strategy"] == best["strategy"]:
            lines.append(f"the winner is the best pure {name}-parallel strategy")
            continue
        lines.append(f"vs pure {name} {other['strategy']}: {_breakdown(other)} — {compare(best, other)}")
    return lines


def compare(best: dict[str, Any], other: dict[str, Any]) -> str:
    """``other`` against the winner in words: "1.05× slower, mostly communication (+3.1 ms per
    step)", or "1.05× faster but out of memory (peak 90.1 of 80 GiB)"."""
    ratio = other["step_time_s"] / best["step_time_s"]
    parts = {
        "compute": other["compute_s"] - best["compute_s"],
        "communication": other["comm_s"] - best["comm_s"],
        "pipeline bubble": _idle(other) - _idle(best),
    }
    slower = ratio >= 1
    why = max(parts, key=lambda k: parts[k] if slower else -parts[k])
    rest = ", ".join(f"{k} {_signed(v)}" for k, v in parts.items() if k != why)
    if slower:
        head = f"{ratio:.2f}× slower than the winner" if ratio >= 1.005 else "as fast as the winner"
        text = f"{head}, mostly {why} ({_signed(parts[why])} per step; {rest})"
    else:
        text = (
            f"{1 / ratio:.2f}× faster than the winner, mostly {why} ({_signed(parts[why])} per step; {rest})"
        )
    if not other["fits"]:
        text += (
            f", but it does not fit in memory (peak {other['peak_memory_bytes'] / GIB:.1f} of "
            f"{other['capacity_bytes'] / GIB:.0f} GiB)"
        )
    return text


def _signed(s: float) -> str:
    return ("+" if s >= 0 else "−") + _t(abs(s))


def _idle(r: dict[str, Any]) -> float:
    return float(r["bubble_fraction"]) * float(r["step_time_s"])


def _breakdown(r: dict[str, Any]) -> str:
    return (
        f"step {_t(r['step_time_s'])} = compute {_t(r['compute_s'])} + communication {_t(r['comm_s'])} "
        f"+ idle {_t(_idle(r))}; peak memory {r['peak_memory_bytes'] / GIB:.1f} of "
        f"{r['capacity_bytes'] / GIB:.0f} GiB"
    )


__all__ = ["compare", "explain", "plot_rows", "results_table", "search_json", "with_fields", "write_csv"]
