"""Golden-file tests of printed programs, in the FileCheck style of LLVM and xDSL.

Each ``cases/NAME.distir`` starts with a ``// RUN:`` line giving its command; ``%s`` stands for
the case file itself. The command's standard output must equal ``cases/NAME.expected`` exactly.
Commands:

- ``distir ARGS...``: the CLI (``shard``, ``lower``, ...), run in-process;
- ``distribute MODEL STRATEGY [--batch N] [--optimizer adam|sgd] [--inference] [--max-norm X]``:
  ``distir.parallel.distribute`` of a zoo model (no CLI command prints it), printed with
  ``print_module``; the case file holds only the RUN line and comments.

A change meant to alter an output regenerates the files (``DISTIR_REGEN_GOLDEN=1 pytest
tests/golden``) and the diff is reviewed like code.
"""

from __future__ import annotations

import argparse
import difflib
import os
import shlex
from pathlib import Path

import pytest
from typer.testing import CliRunner

from distir.autodiff.train import Optimizer
from distir.cli import app
from distir.frontends.zoo.registry import build_model
from distir.ir.printer import print_module
from distir.parallel.distribute import distribute
from distir.parallel.strategy import parse_strategy

CASES = Path(__file__).with_name("cases")
REGEN = os.environ.get("DISTIR_REGEN_GOLDEN") == "1"
PREFIX = "// RUN:"


def command_of(case: Path) -> list[str]:
    """The case's RUN line as arguments, ``%s`` replaced by the case's path."""
    first = case.read_text().splitlines()[0]
    if not first.startswith(PREFIX):
        raise ValueError(f"{case.name}:1: the first line must be '{PREFIX} <command>'")
    return [str(case) if a == "%s" else a for a in shlex.split(first[len(PREFIX) :])]


def _distribute(args: list[str]) -> str:
    ap = argparse.ArgumentParser(prog="distribute", exit_on_error=False)
    ap.add_argument("model")
    ap.add_argument("strategy")
    ap.add_argument("--batch", type=int, required=True)
    ap.add_argument("--optimizer", default="adam")
    ap.add_argument("--inference", action="store_true")
    ap.add_argument("--max-norm", type=float, default=0.0)
    ns = ap.parse_args(args)
    prog = distribute(
        build_model(ns.model, ns.batch),
        parse_strategy(ns.strategy),
        Optimizer(ns.optimizer, max_norm=ns.max_norm),
        train=not ns.inference,
        comm_streams=True,
    )
    return print_module(prog)


def run(cmd: list[str]) -> str:
    """The standard output of a case's command (a failing command fails the test)."""
    tool, args = cmd[0], cmd[1:]
    if tool == "distir":
        r = CliRunner().invoke(app, args)
        assert r.exit_code == 0, f"exit code {r.exit_code}: {r.stderr}"
        return r.stdout
    if tool == "distribute":
        return _distribute(args)
    raise ValueError(f"unknown tool {tool!r} in a RUN line (distir or distribute)")


ALL = sorted(CASES.glob("*.distir"))


def test_every_command_kind_has_a_case() -> None:
    kinds = {tuple(command_of(c)[:2]) if command_of(c)[0] == "distir" else ("distribute",) for c in ALL}
    assert {("distir", "shard"), ("distir", "lower"), ("distribute",)} <= kinds


def test_a_missing_run_line_is_named(tmp_path: Path) -> None:
    bad = tmp_path / "bad.distir"
    bad.write_text("func @f() {\n}\n")
    with pytest.raises(ValueError, match=r"bad\.distir:1: the first line"):
        command_of(bad)


@pytest.mark.parametrize("case", ALL, ids=[c.stem for c in ALL])
def test_golden(case: Path) -> None:
    got = run(command_of(case))
    expected = case.with_suffix(".expected")
    if REGEN:
        expected.write_text(got)
    want = expected.read_text()
    if got != want:
        diff = "".join(difflib.unified_diff(want.splitlines(True), got.splitlines(True), "expected", "got"))
        pytest.fail(f"{case.name}: the output differs from {expected.name}:\n{diff}")
