"""The body of ``distir search``: options to a ``SearchRequest``, progress, outputs, errors.

Files: the result store defaults to ``$XDG_CACHE_HOME/distir/search.sqlite`` (``~/.cache``);
the Pareto plot and page go where ``--plot``/``--html`` say, else next to the store under
``reports/``, named by the search's key and its view (pins, ``--top``, ``--explain``: views of
one search do not overwrite each other's), so no file the user wrote is touched.
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from pathlib import Path
from typing import Any, NoReturn

import typer
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

# the screen counts base strategies (each climbs its memory ladder until it fits: the summary's
# "strategies screened" counts every rung), the others their own items
PHASES = {
    "screen": "screening base strategies",
    "placement": "annealing placements",
    "simulate": "simulating exactly",
}


def default_store() -> Path:
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "distir" / "search.sqlite"


def _fail(err: Console, message: str) -> NoReturn:
    err.print(message, markup=False)
    raise typer.Exit(2)


def _numerics(a: dict[str, Any], err: Console) -> tuple[str, str]:
    """``--dtype`` and ``--precision`` with ``auto`` resolved as the trainers run
    (``distir.report.numerics``)."""
    from distir.frontends.zoo.model import ModelError
    from distir.hardware.specs import HardwareError
    from distir.report.numerics import NumericsError, resolve_numerics

    try:
        return resolve_numerics(str(a.get("model", "")), a["dtype"], a["precision"], a["train"], a["cluster"])
    except (HardwareError, ModelError, NumericsError) as e:
        _fail(err, str(e))


def run_search_command(a: dict[str, Any], out: Console, err: Console, json_out: bool, debug: bool) -> None:
    """``distir search`` with its parsed options ``a``: checks them, runs the search with a
    progress bar, writes the plot, page and CSV, exports the winner, prints the report."""
    from distir.report.numerics import slow_half_warnings
    from distir.report.pareto_html import write_html
    from distir.report.pareto_png import write_png
    from distir.report.search_report import plot_rows, write_csv

    _check_options(a, err)
    dtype, precision = _numerics(a, err)
    store = None if a["fresh"] else (a["store"] or default_store())
    req, o, plot, html = _searched(a, dtype, precision, store, err, json_out, debug)
    for warning in slow_half_warnings(dtype, o.cluster):
        err.print(f"warning: {warning}", markup=False, soft_wrap=True)
    title = f"{req.model} on {o.cluster.describe()}, batch {req.batch}"
    rows = plot_rows(o)
    try:
        write_png(rows, plot, title)
        write_html(rows, html, title)
        if a["csv_path"] is not None:
            write_csv(o, a["csv_path"])
    except OSError as e:  # checked before the search; the disk may have filled up since
        _fail(err, f"cannot write the search's outputs: {e}")
    exported = _export_winner(o, a, err, debug)
    if json_out:
        _print_json(o, a, plot, html, exported, err)
    else:
        _print_text(o, a, store, plot, html, exported, out, err)
        if (line := simulate_command(req, o.best())) is not None:
            out.print(f"the winner, simulated alone: {line}", markup=False, soft_wrap=True)


def simulate_command(req: Any, best: dict[str, Any] | None) -> str | None:
    """The ``distir simulate`` command line giving the search's winner (``best``, a fitting
    result) the figures the search did: its model, strategy, batch, cluster, numerics and the
    switches the search ran it with; None without a fitting winner or with a cluster object."""
    import shlex

    if best is None or not best.get("fits") or not isinstance(req.cluster, str):
        return None
    words = ["distir", "simulate", "--model", req.model, "--strategy", str(best["strategy"])]
    words += ["--batch", str(req.batch), "--cluster", req.cluster]
    words += ["--dtype", req.dtype, "--precision", req.precision]
    words += [] if req.train else ["--infer"]
    words += [] if req.optimizer == "adam" else ["--optimizer", req.optimizer]
    words += [] if req.trainer == "distir" else ["--trainer", req.trainer]
    words += ["--tp-comm-overlap"] if req.tp_comm_overlap else []
    words += [] if req.tp_layout == "declared" else ["--tp-layout", req.tp_layout]
    return shlex.join(words)


def _check_options(a: dict[str, Any], err: Console) -> None:
    """The options no search can run with, each one line and exit 2 before any work."""
    from distir.parallel.trainers import TRAINERS
    from distir.report.bounds import search_error, search_ops_error
    from distir.search.executor import EXECUTORS
    from distir.search.space import MAX_K, max_k_error

    if (why := max_k_error(a["microbatches"], a["max_k"])) is not None:
        _fail(err, why)
    if a["fresh"] and a["store"] is not None:
        _fail(err, f"--fresh neither reads nor writes a result store: drop --store {a['store']}, or --fresh")
    a["max_k"] = MAX_K if a["max_k"] is None else a["max_k"]
    if a["executor"] not in EXECUTORS:
        _fail(err, f"--executor must be one of {', '.join(EXECUTORS)}, got {a['executor']!r}")
    if (why := search_error(a["workers"], a["executor"], a["batch"])) is not None:
        _fail(err, why)
    if (
        why := search_ops_error(a["model"], a["microbatches"], a["max_k"], a["batch"], a["train"])
    ) is not None:
        _fail(err, why)
    if a["optimizer"] not in (None, "sgd", "adam"):
        _fail(err, f"--optimizer must be sgd or adam, got {a['optimizer']!r}")
    if a["optimizer"] is not None and not a["train"]:
        _fail(
            err,
            f"--infer runs no optimizer step: drop --optimizer {a['optimizer']}, or search training "
            "(--train)",
        )
    from distir.report.numerics import DTYPES, exact_inference_error

    if a["dtype"] not in DTYPES:
        _fail(err, f"--dtype must be {', '.join(DTYPES[:-1])} or {DTYPES[-1]}, got {a['dtype']!r}")
    if a["precision"] not in ("auto", "mixed", "pure"):
        _fail(err, f"--precision must be auto, mixed or pure, got {a['precision']!r}")
    if why := exact_inference_error(a["precision"], a["train"]):
        _fail(err, why)
    searched = a.get("trainer", "distir")
    if searched not in TRAINERS:
        _fail(err, f"--trainer must be one of {', '.join(TRAINERS)}, got {searched!r}")
    if searched != "distir" and not a["train"]:
        _fail(err, f"--trainer {searched} describes training: an inference search takes none")
    if a.get("tp_layout", "declared") not in ("declared", "auto"):
        _fail(err, f"--tp-layout must be declared or auto, got {a['tp_layout']!r}")
    if a.get("export_out") is not None and a.get("export_to") is None:
        _fail(err, "--export-out is where --export writes the winner: give --export TARGET, or drop it")
    if a.get("export_to") is not None:
        from distir.report.export_cli import check_target

        check_target(a["export_to"], err, "--export")
        if searched != "distir" and a["export_to"] != searched:
            _fail(
                err,
                f"--export {a['export_to']} with --trainer {searched}: the plans are searched as "
                f"{searched} runs them; export to {searched}, or search with --trainer {a['export_to']}",
            )


def _refuse_model_early(model: str, target: str, err: Console) -> None:
    """``--export`` to a trainer that cannot take the model: said before the search, not after."""
    from distir.export.plan import BUILDS_ITS_OWN, ModelError, transformer_refusal

    if target not in BUILDS_ITS_OWN:
        return
    try:
        why = transformer_refusal(model, target)
    except ModelError:  # a model string that does not build: the search reports it
        return
    if why:
        _fail(err, why)


def _request(a: dict[str, Any], dtype: str, precision: str, store: Path | None) -> Any:
    """The ``SearchRequest`` the options describe (``dtype``, ``precision``: ``auto`` resolved)."""
    from distir.search.run import SearchRequest
    from distir.search.space import CP_MIN_SEQ, Pins

    pins = Pins(
        dp=a["dp"],
        tp=a["tp"],
        pp=a["pp"],
        k=a["microbatches"],
        schedule=a["schedule"],
        zero=a["zero"],
        recompute=a["recompute"],
        max_k=a["max_k"],
        mbs=a["microbatch_size"],
        hsdp=a["hsdp"],
        cp=a.get("cp"),
        cp_from_seq=a.get("cp_from_seq") or CP_MIN_SEQ,
    )
    return SearchRequest(
        model=a["model"],
        cluster=a["cluster"],
        batch=a["batch"],
        train=a["train"],
        optimizer=a["optimizer"] or "adam",
        dtype=dtype,
        precision=precision,
        pins=pins,
        top=a["top"],
        workers=a["workers"],
        executor=a["executor"],
        store=store,
        explain=a["explain_"],
        tp_layout=a.get("tp_layout", "declared"),
        tp_comm_overlap=a.get("tp_comm_overlap", False),
        trainer=a.get("trainer", "distir"),
    )


def _searched(
    a: dict[str, Any],
    dtype: str,
    precision: str,
    store: Path | None,
    err: Console,
    json_out: bool,
    debug: bool,
) -> tuple[Any, Any, Path, Path]:
    """The request, the search's outcome (with a progress bar on a terminal) and the plot and
    page paths, checked writable before the search starts; a user error is one line, exit 2."""
    from distir.frontends.zoo.model import ModelError
    from distir.hardware.specs import HardwareError
    from distir.parallel.sharding.propagate import ShardingError
    from distir.parallel.strategy import StrategyError
    from distir.search.executor import ExecutorError
    from distir.search.space import SpaceError
    from distir.search.store import StoreError

    try:
        req = _request(a, dtype, precision, store)
        plot, html = _report_paths(req, a, store)
        _check_outputs(a, store, plot, html, err)
        if a.get("export_to") is not None:
            _refuse_model_early(req.model, a["export_to"], err)
        return req, _search_with_progress(req, err, show=not json_out and sys.stderr.isatty()), plot, html
    except (
        ModelError,
        HardwareError,
        SpaceError,
        StrategyError,
        ShardingError,
        StoreError,
        ExecutorError,
    ) as e:
        if debug:
            traceback.print_exc()
        _fail(err, str(e))


def _search_with_progress(req: Any, err: Console, show: bool) -> Any:
    """``search(req)`` with a progress bar per phase on ``err`` (when ``show``)."""
    from distir.search.run import search

    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("ETA"),
        TimeRemainingColumn(),
        console=err,
        transient=True,
        disable=not show,
    ) as bar:
        tasks: dict[str, Any] = {}

        def progress(phase: str, done: int, total: int) -> None:
            if phase not in tasks:
                tasks[phase] = bar.add_task(PHASES.get(phase, phase), total=total)
            bar.update(tasks[phase], completed=done, total=total)

        return search(req, progress)


def _print_json(o: Any, a: dict[str, Any], plot: Path, html: Path, exported: Any, err: Console) -> None:
    """``--json``: the search's one JSON object, with the export written to ``--export-out``."""
    from distir.files import write_atomically
    from distir.report.search_report import explain, search_json

    payload = search_json(o)
    payload["plot"], payload["html"] = str(plot), str(html)
    if a["explain_"]:
        payload["explain"] = explain(o)
    if exported is not None:
        from distir.report.export_cli import export_json

        if a.get("export_out") is not None:
            try:
                write_atomically(a["export_out"], exported.text)
            except OSError as e:
                _fail(err, f"--export-out {a['export_out']}: {e}")
        payload["export"] = export_json(exported, a.get("export_out"))
    sys.stdout.write(json.dumps(payload, indent=2) + "\n")


def _print_text(
    o: Any,
    a: dict[str, Any],
    store: Path | None,
    plot: Path,
    html: Path,
    exported: Any,
    out: Console,
    err: Console,
) -> None:
    """The text report: results table, advice, timings, ``--explain``, the files written."""
    from distir.report.search_report import explain, results_table

    # pipes and 80-column terminals would squeeze the strategy column to nothing (rich clamps a
    # print's width to the console's, so widen the console itself while the table prints)
    width = out.width
    out.width = max(width, 120)
    try:
        out.print(results_table(o))
    finally:
        out.width = width
    for line in o.advice:
        out.print(line, markup=False)
    out.print(_timings_line(o, store))
    if a["explain_"]:
        out.print()
        for line in explain(o):
            out.print(line, markup=False)
    out.print(f"Pareto plot: {plot}\nInteractive page: {html}", markup=False)
    if a["csv_path"] is not None:
        out.print(f"CSV: {a['csv_path']}", markup=False)
    if exported is not None:
        from distir.report.export_cli import emit

        out.print(f"\nthe winner for {exported.target}:", markup=False)
        emit(exported, a.get("export_out"), out, err)


def _timings_line(o: Any, store: Path | None) -> str:
    """Where the search's time went (or that it came from the store)."""
    t = o.timings
    if o.from_store:
        return (
            f"from the store {store} in {t['render_s']:.2f} s: this search ran before "
            f"({o.n_screened} strategies screened in {t['screen_s']:.2f} s, {t['total_s']:.2f} s in all); "
            "--fresh searches again"
        )
    return (
        f"screen {t['screen_s']:.2f} s ({o.n_screened} strategies: the base strategies, each up its "
        f"memory ladder until it fits; {o.profiles} layer simulations), "
        f"placement {t['placement_s']:.2f} s, exact simulation {t['simulate_s']:.2f} s"
        + (f" ({o.n_cached} from the store {store})" if o.n_cached else "")
    )


def _report_paths(req: Any, a: dict[str, Any], store: Path | None) -> tuple[Path, Path]:
    """The Pareto plot and page: ``--plot``/``--html``, else under ``reports/`` next to the
    store, named by the search and its view (pins, top, ...: a pinned search keeps the unpinned
    one's), never in the working directory."""
    from distir.search.run import view_of
    from distir.search.store import search_key

    key = f"{search_key(req.key_parts())}-{search_key(view_of(req))[:8]}"
    reports = (store or default_store()).parent / "reports"
    return a["plot"] or reports / f"search-{key}.png", a["html"] or reports / f"search-{key}.html"


def _check_outputs(a: dict[str, Any], store: Path | None, plot: Path, html: Path, err: Console) -> None:
    """Every file the search will write, checked before it starts (``distir.files.check_output``):
    a bad path is one line and exit 2 in a second, not an error after the whole search."""
    from distir.files import OutputPathError, check_distinct, check_output

    given = "--store" if a["store"] is not None else "the result store"
    paths = {
        "--csv": a["csv_path"],
        "--plot" if a["plot"] else "the Pareto plot (--plot)": plot,
        "--html" if a["html"] else "the Pareto page (--html)": html,
        "--export-out": a.get("export_out"),
    }
    try:
        if store is not None:  # first: the default plot and page go next to it
            try:
                check_output(store, given)
            except OutputPathError as e:
                raise OutputPathError(f"{e}; give a writable --store FILE, or --fresh") from None
        for option, path in paths.items():
            if path is not None:
                check_output(path, option)
        from distir.frontends.files import model_input
        from distir.hardware.cluster import cluster_input

        reads = {"--model": model_input(a["model"]), "--cluster": cluster_input(a["cluster"])}
        check_distinct({given: store, **paths}, reads)
        if store is not None:
            store.parent.mkdir(parents=True, exist_ok=True)
    except OutputPathError as e:
        _fail(err, str(e))
    except OSError as e:
        _fail(err, f"{given} {store}: cannot create its directory: {e.strerror or e}")


def _export_winner(o: Any, a: dict[str, Any], err: Console, debug: bool) -> Any:
    """``--export``: the best simulated strategy written for the target (None without it)."""
    if a.get("export_to") is None:
        return None
    from distir.report.export_cli import build_export

    best = o.best()
    if best is None or "error" in best:
        _fail(err, "--export: no strategy was simulated successfully; nothing to export")
    if not best["fits"]:
        err.print(f"warning: the winner {best['strategy']} does not fit in memory", markup=False)
    r = o.request
    return build_export(
        a["export_to"],
        r.model,
        best["strategy"],
        r.batch,
        dtype=r.dtype,
        precision=r.precision,
        optimizer=r.optimizer,
        cluster=r.cluster,
        err=err,
        debug=debug,
    )
