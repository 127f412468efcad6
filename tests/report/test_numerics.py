"""``--dtype auto --precision auto`` (``distir.report.numerics``): an unknown precision is named
with every choice, ``auto`` (the default) included."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from distir.cli import app
from distir.report.numerics import NumericsError, resolve_numerics

CHOICES = "--precision must be auto, mixed, pure, fp8 or fp8-delayed, got 'mixd'"


def test_an_unknown_precision_lists_auto_too() -> None:
    with pytest.raises(NumericsError, match=CHOICES):
        resolve_numerics("gpt2-117m", "auto", "mixd", True, "h100")
    r = CliRunner().invoke(app, ["simulate", "--model", "mlp", "--strategy", "d2", "--precision", "mixd"])
    assert r.exit_code == 2 and r.stderr.strip() == CHOICES
