"""The body of ``distir export`` and of ``distir search --export``: a plan written for a trainer.

The configuration goes to stdout (or ``--out``); warnings (the nearest configuration the target
can express) and notes (what goes in code) go to stderr as ``warning: …`` / ``note: …`` lines, or
into the ``--json`` object. A plan the target cannot express exits with status 2 and one line
naming the feature.
"""

from __future__ import annotations

import json
import sys
import traceback
from pathlib import Path
from typing import Any, NoReturn

import typer
from rich.console import Console

from distir.export import TARGETS, Exported, ExportError, export, make_plan
from distir.files import OutputPathError, check_distinct, check_output, write_atomically


def _fail(err: Console, message: str) -> NoReturn:
    err.print(message, markup=False)
    raise typer.Exit(2)


def check_target(target: str, err: Console, option: str = "--to") -> None:
    if target not in TARGETS:
        _fail(err, f"{option} must be one of {', '.join(TARGETS)}, got {target!r}")


def build_export(
    target: str,
    model: str,
    strategy: str,
    batch: int,
    *,
    dtype: str,
    precision: str,
    optimizer: str,
    cluster: str | None,
    err: Console,
    debug: bool,
) -> Exported:
    """The export, user errors as one line on ``err`` (exit 2)."""
    from distir.frontends.zoo.model import ModelError
    from distir.hardware.specs import HardwareError
    from distir.parallel.strategy import StrategyError

    try:
        plan = make_plan(model, strategy, batch, dtype, precision, optimizer, cluster, target)
        return export(plan, target)
    except (ExportError, StrategyError, ModelError, HardwareError) as e:
        if debug:
            traceback.print_exc()
        _fail(err, str(e))


def check_path(path: Path, option: str, err: Console, model: str = "", cluster: str = "") -> None:
    """``path`` writable (``distir.files.check_output``) and not a file the command reads (the
    ``model``'s Hugging Face config or model file, the ``cluster`` file), else one line and exit 2."""
    from distir.frontends.files import model_input
    from distir.hardware.cluster import cluster_input

    try:
        check_output(path, option)
        check_distinct({option: path}, {"--model": model_input(model), "--cluster": cluster_input(cluster)})
    except OutputPathError as e:
        _fail(err, str(e))


def emit(exported: Exported, out_path: Path | None, out: Console, err: Console) -> None:
    """The text to ``out_path`` or stdout; warnings and notes to stderr."""
    for w in exported.warnings:
        err.print(f"warning: {w}", markup=False)
    for n in exported.notes:
        err.print(f"note: {n}", markup=False)
    if out_path is None:
        sys.stdout.write(exported.text)
        return
    if out_path.is_dir():
        _fail(err, f"{out_path}: is a directory; give a file name")
    write_atomically(out_path, exported.text)
    out.print(f"{exported.target} configuration written to {out_path}", markup=False)


def export_json(exported: Exported, out_path: Path | None) -> dict[str, Any]:
    return {
        "target": exported.target,
        "text": exported.text,
        "warnings": list(exported.warnings),
        "notes": list(exported.notes),
        "out": str(out_path) if out_path is not None else None,
    }


def run_export_command(a: dict[str, Any], out: Console, err: Console, json_out: bool, debug: bool) -> None:
    check_target(a["to"], err)
    if a["out_path"] is not None:
        check_path(a["out_path"], "--out", err, a["model"], a["cluster"])
    exported = build_export(
        a["to"],
        a["model"],
        a["strategy"],
        a["batch"],
        dtype=a["dtype"],
        precision=a["precision"],
        optimizer=a["optimizer"],
        cluster=a["cluster"],
        err=err,
        debug=debug,
    )
    if json_out:
        if a["out_path"] is not None:
            write_atomically(a["out_path"], exported.text)
        payload = {"model": a["model"], "strategy": a["strategy"], "batch": a["batch"]}
        sys.stdout.write(json.dumps(payload | export_json(exported, a["out_path"]), indent=2) + "\n")
        return
    emit(exported, a["out_path"], out, err)
